# tfring.migrate: ports a Horovod TensorFlow 2 / Keras or PyTorch script to
# tfring.
#
# Why a tool: "change one import" is not enough on TensorFlow 2.16+, where
# tf.keras is Keras 3 and Horovod-era scripts also meet Keras 2 -> 3 and
# TF1 -> TF2 changes, nor on torch 2.x for a torch 1.x script. Each family
# of rewrites lives in its own module and works on libcst's concrete syntax
# tree, so comments and formatting of the untouched code stay exactly as
# they were:
#   horovod_imports  Horovod imports and horovod.run -> tfring
#   keras3           Keras 2 -> 3 (compile arguments, .variables, lr=, ...)
#   training_calls   Keras 2 -> 3 fit / evaluate / predict calls
#                    (*_generator, worker and queue arguments)
#   gpu_pinning      ConfigProto / set_session -> tf.config
#   torch2           torch 1.x -> 2.x (torch.cuda.amp, size_average=)
#   names            what a name is imported from; which frameworks a
#                    script uses (a PyTorch-only script gets no Keras edits)
#   findings         what cannot be ported (Spark, Ray, TF1
#                    sessions, estimators, Lightning's Horovod strategy),
#                    with line and suggested path
# `python -m tfring.migrate PATH...` (see __main__.py) prints a unified diff
# or, with --write, rewrites the files.

import dataclasses

from tfring.migrate._libcst import cst, metadata
from tfring.migrate import findings as _findings
from tfring.migrate import gpu_pinning as _gpu_pinning
from tfring.migrate import horovod_imports as _horovod_imports
from tfring.migrate import keras3 as _keras3
from tfring.migrate import names as _names
from tfring.migrate import torch2 as _torch2
from tfring.migrate import training_calls as _training_calls
from tfring.migrate.findings import Finding


@dataclasses.dataclass
class MigrationResult:
    source: str       # the ported script
    findings: list    # Finding: what still needs a person

    def changed(self, original):
        return self.source != original


def _rank_expression(aliases):
    alias = "hvd" if "hvd" in aliases or not aliases else sorted(aliases)[0]
    return f"{alias}.local_rank()"


def _visit_with_names(module, transformer):
    """Runs a transformer that asks what names are imported from."""
    return metadata.MetadataWrapper(module).visit(transformer)


def _ensure_tensorflow_import(module):
    """Adds `import tensorflow as tf` after the last top-of-file import
    unless the script binds `tf` already."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue  # a compound statement's body is a block, not a list
        for small in statement.body:
            if isinstance(small, cst.Import) and any(
                    (a.asname.name.value if a.asname else None) == "tf"
                    for a in small.names):
                return module
    body = list(module.body)
    position = 0
    for i, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and isinstance(
                statement.body[0], (cst.Import, cst.ImportFrom)):
            position = i + 1
    body.insert(position, cst.parse_statement("import tensorflow as tf\n"))
    return module.with_changes(body=body)


def migrate_source(source):
    """Ports one script's text; returns a MigrationResult."""
    module = cst.parse_module(source)
    aliases = _horovod_imports.horovod_aliases(module)
    frameworks = _names.imported_frameworks(module)
    module = module.visit(_horovod_imports.HorovodImports())
    if "torch" in frameworks:
        module = _visit_with_names(module, _torch2.Torch2())
    if frameworks != {"torch"}:  # Keras 2 -> 3 and TF1 -> TF2
        keras3 = _keras3.Keras3()
        module = _visit_with_names(module, keras3)
        module = module.visit(_training_calls.TrainingCalls())
        pinning = _gpu_pinning.GpuPinning(_rank_expression(aliases))
        module = module.visit(pinning)
        if keras3.needs_tensorflow_import or pinning.rewrote:
            module = _ensure_tensorflow_import(module)
    return MigrationResult(module.code, _findings.collect(module, aliases, frameworks))


__all__ = ["Finding", "MigrationResult", "migrate_source"]
