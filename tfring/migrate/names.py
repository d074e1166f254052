# What a name in the script stands for, through the script's own imports.
#
# Why: a rewrite keyed on the text of a call hits the wrong library. `SGD(lr=)`
# is Keras 2's spelling of Keras 3's `learning_rate=` but torch.optim's own
# keyword, and `optim.SGD` or `opt_cls` tell nothing by themselves. libcst's
# QualifiedNameProvider follows `import ... as`, `from ... import` and scopes
# (a function parameter named `tf` is not TensorFlow), so the rewrites ask
# what a name is imported from instead. The framework check decides which
# families of rewrites a script gets at all: a PyTorch script gets no Keras 3
# edits.

from tfring.migrate._libcst import cst, metadata
from tfring.migrate.findings import dotted_name


def imported_names(visitor, node):
    """The dotted names `node` (a Name or Attribute, in a visitor or
    transformer that declares QualifiedNameProvider) is imported as:
    {"torch.optim.SGD"} for `optim.SGD` after `import torch.optim as optim`;
    empty for local names, builtins and unbound names."""
    # A node built by a rewrite after the metadata was computed has none.
    names = visitor.get_metadata(metadata.QualifiedNameProvider, node, set())
    return {n.name for n in names
            if n.source == metadata.QualifiedNameSource.IMPORT}


_TENSORFLOW = ("tensorflow", "keras", "tf_keras")


def imported_frameworks(module):
    """{"tensorflow", "torch"} or a part of it: the frameworks a script
    imports, directly or through Horovod (horovod.tensorflow, horovod.keras
    -> tensorflow; horovod.torch -> torch)."""
    found = set()

    def add(path):
        parts = (path or "").split(".")
        if parts[0] == "horovod" and len(parts) > 1:
            parts = parts[1:]
        if parts[0] in _TENSORFLOW:
            found.add("tensorflow")
        elif parts[0] == "torch":
            found.add("torch")

    class Finder(cst.CSTVisitor):
        def visit_Import(self, node):
            for alias in node.names:
                add(dotted_name(alias.name))

        def visit_ImportFrom(self, node):
            if node.module is None or node.relative:
                return
            path = dotted_name(node.module)
            add(path)
            if path == "horovod" and not isinstance(node.names, cst.ImportStar):
                for alias in node.names:  # from horovod import torch as hvd
                    add(f"horovod.{alias.name.value}")

    module.visit(Finder())
    return found
