# What the porting tool cannot port, with file:line and the suggested path.
#
# Why a separate pass: these uses need a person (Spark, Ray, TF1 sessions,
# estimators, PyTorch Lightning's Horovod strategy); rewriting them blindly
# would produce a script that runs but does something else. The visitor only reads the tree
# and reports; the rewrites leave these lines alone.

import dataclasses

from tfring import unsupported
from tfring.migrate._libcst import cst, m, metadata


@dataclasses.dataclass(frozen=True)
class Finding:
    line: int
    what: str
    suggestion: str

    def format(self, path):
        return f"{path}:{self.line}: {self.what}. {self.suggestion}"


def dotted_name(node):
    """'a.b.c' for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


_BINDING_PARTS = ("tensorflow", "keras", "torch")


def unsupported_feature(path):
    """The tfring.unsupported feature a Horovod module path reaches for
    (horovod.spark.keras -> spark, horovod.tensorflow.data.compute_service
    -> data), else None. The in-process
    launcher `run` is not one: horovod_imports ports it."""
    parts = path.split(".")
    if parts[0] != "horovod":
        return None
    for part in parts[1:]:
        if part not in _BINDING_PARTS:
            return part if part in unsupported.FEATURES and part != "run" else None
    return None


# TF1 APIs that TensorFlow 2.16+ no longer has in its main namespace, by
# their path after `tf.` (or `tf.compat.v1.`).
_TF1 = {
    "Session": "a TF1 session",
    "InteractiveSession": "a TF1 session",
    "train.MonitoredTrainingSession": "a TF1 MonitoredTrainingSession",
    "placeholder": "a TF1 placeholder",
    "app.run": "TF1's tf.app.run",
    "train.get_or_create_global_step": "a TF1 global step",
    "train.get_global_step": "a TF1 global step",
    "losses.softmax_cross_entropy": "a TF1 loss function",
    "losses.sparse_softmax_cross_entropy": "a TF1 loss function",
}


def _tf1_use(parts):
    """What a tf.* path names when it is a TF1 API, else None."""
    rest = parts[1:]
    if rest[:2] == ["compat", "v1"]:
        rest = rest[2:]
    name = ".".join(rest)
    if name in _TF1:
        return _TF1[name]
    if len(rest) == 2 and rest[0] == "train" and rest[1].endswith("Optimizer"):
        return "a TF1 optimizer (use the tf.keras.optimizers one)"
    return None


_TF1_ADVICE = ("TF2 runs eagerly: call the model directly (or inside a "
               "tf.function), train with model.fit or a tf.GradientTape loop "
               "and tfring.DistributedGradientTape, and broadcast with "
               "tfring.broadcast_variables(model.variables, root_rank=0)")
# unsupported.FEATURES speaks Keras and tf.data; for Horovod's PyTorch
# parts (horovod.spark.torch, horovod.spark.lightning)
# the classes and the replacements are others.
_TORCH_SAMPLER = ("torch.utils.data.distributed.DistributedSampler(dataset, "
                  "num_replicas=hvd.size(), rank=hvd.rank())")
_TORCH_FEATURES = {
    "spark": (
        "Spark integration (TorchEstimator, LightningEstimator)",
        "read the data in every rank with a torch DataLoader over a "
        f"{_TORCH_SAMPLER}, train with tfring.torch.DistributedOptimizer and "
        "launch the script with `tfringrun -np N python train.py` (or "
        "mpirun) on the hosts instead"),
}
_LIGHTNING_ADVICE = (
    "PyTorch Lightning 2.x has no Horovod strategy, and tfring does not "
    "plug into Lightning: train with Lightning's own strategy=\"ddp\", or "
    "write the loop in plain PyTorch with tfring.torch.DistributedOptimizer "
    "and launch it with `tfringrun -np N python train.py`")
_LIGHTNING_KEYWORDS = ("accelerator", "strategy", "distributed_backend")
_ESTIMATOR_ADVICE = ("tf.estimator is gone from TensorFlow 2.16+: move the "
                     "model_fn into a keras.Model and train with model.fit "
                     "and tfring.keras.DistributedOptimizer")


class FindingsCollector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (metadata.PositionProvider,)

    def __init__(self, horovod_aliases, torch_script):
        super().__init__()
        self.horovod_aliases = dict(horovod_aliases)  # name -> Horovod path
        self.torch_script = torch_script
        self.findings = []
        self._seen = set()

    def _add(self, node, what, suggestion):
        line = self.get_metadata(metadata.PositionProvider, node).start.line
        # One report per line and cause (hvd.spark.run holds hvd.spark).
        if (line, suggestion) not in self._seen:
            self._seen.add((line, suggestion))
            self.findings.append(Finding(line, what, suggestion))

    def _report_feature(self, node, feature, path, horovod_path):
        offered, instead = unsupported.FEATURES[feature]
        if feature in _TORCH_FEATURES and (self.torch_script
                                           or _is_torch_path(horovod_path)):
            offered, instead = _TORCH_FEATURES[feature]
        self._add(node, f"uses Horovod's {offered} ({path})",
                  f"tfring does not provide it: {instead}")

    def _check_module_path(self, node, path):
        parts = path.split(".")
        if parts[0] != "horovod" or len(parts) < 2:
            return
        feature = unsupported_feature(path)
        if feature is not None:
            self._report_feature(node, feature, path, path)
        elif parts[1] not in ("tensorflow", "keras", "torch", "mxnet", "run"):
            self._add(node, f"uses {path}",
                      "tfring ports horovod.tensorflow, "
                      "horovod.tensorflow.keras, horovod.keras, "
                      "horovod.torch and horovod.mxnet only")

    def visit_Import(self, node):
        for alias in node.names:
            self._check_module_path(node, dotted_name(alias.name) or "")

    def visit_ImportFrom(self, node):
        if node.module is not None and not node.relative:
            path = dotted_name(node.module) or ""
            self._check_module_path(node, path)
            if not isinstance(node.names, cst.ImportStar):
                for alias in node.names:  # from horovod.torch import elastic
                    self._check_module_path(node, f"{path}.{alias.name.value}")
            if path.split(".")[:2] == ["tensorflow", "estimator"]:
                self._add(node, "imports tf.estimator", _ESTIMATOR_ADVICE)

    def visit_Call(self, node):
        # Trainer(accelerator="horovod") / strategy="horovod" (Lightning)
        for arg in node.args:
            if (arg.keyword is not None and arg.keyword.value in _LIGHTNING_KEYWORDS
                    and m.matches(arg.value, m.SimpleString())
                    and arg.value.evaluated_value == "horovod"):
                self._add(node, f"uses PyTorch Lightning's Horovod strategy "
                          f"({arg.keyword.value}='horovod')", _LIGHTNING_ADVICE)

    def visit_Attribute(self, node):
        path = dotted_name(node)
        if path is None:
            return
        parts = path.split(".")
        horovod_path = self.horovod_aliases.get(parts[0])
        feature = (unsupported_feature(".".join([horovod_path] + parts[1:]))
                   if horovod_path is not None and len(parts) > 1 else None)
        if feature is not None:
            self._report_feature(node, feature, path,
                                 ".".join([horovod_path] + parts[1:]))
        elif parts[0] in ("tf", "tensorflow"):
            if "estimator" in parts[1:3]:
                self._add(node, f"uses {path}", _ESTIMATOR_ADVICE)
            elif _tf1_use(parts) is not None:
                self._add(node, f"uses {_tf1_use(parts)} ({path})",
                          _TF1_ADVICE)


def _is_torch_path(path):
    return bool({"torch", "lightning"} & set(path.split(".")))


def collect(module, horovod_aliases, frameworks):
    """The Findings of a ported module. `horovod_aliases` and `frameworks`
    are those of the script before porting (names.py): in a PyTorch script
    (or one using Horovod's PyTorch parts) the advice is PyTorch's."""
    torch_script = (frameworks == {"torch"} or any(
        map(_is_torch_path, horovod_aliases.values())))
    wrapper = metadata.MetadataWrapper(module, unsafe_skip_copy=True)
    collector = FindingsCollector(horovod_aliases, torch_script)
    wrapper.visit(collector)
    return sorted(collector.findings, key=lambda f: f.line)
