# Horovod features that tfring does not provide, and what to use instead.
#
# Why: scripts ported from Horovod reach for `horovod.spark`,
# `horovod.ray`, ... A bare "module has no attribute 'spark'" reads like a
# bug in tfring or a typo. Attribute access (`tfring.ray.RayExecutor`) and
# imports (`import tfring.spark`, `from tfring import ray`) of those names
# raise an error that names the feature and the replacement instead. One
# table serves the attribute hook of each tfring package and the import
# hook, and the porting tool (python -m tfring.migrate) quotes it.

import importlib.abc
import sys

_LAUNCH = ("launch the script with `tfringrun -np N python train.py` (or "
           "mpirun) on the hosts instead")

# name -> (what Horovod offered there, what to do with tfring)
FEATURES = {
    "spark": ("Spark integration (horovod.spark.run, KerasEstimator)",
              "read the data with tf.data in the script and " + _LAUNCH),
    "ray": ("Ray integration (RayExecutor, ElasticRayExecutor)", _LAUNCH),
    "data": ("tf.data compute service (TfDataServiceConfig, "
             "send_to_data_service)",
             "build the input pipeline in every rank with tf.data and "
             "shard it with dataset.shard(tfring.size(), tfring.rank()), or "
             "start TensorFlow's own tf.data service "
             "(tf.data.experimental.service) and read from it with "
             "dataset.apply(tf.data.experimental.service.distribute(...))"),
    "run": ("the in-process launcher horovod.run(fn, np=N)",
            "call fn() at the bottom of the script and " + _LAUNCH),
}


def message(feature, where="tfring"):
    offered, instead = FEATURES[feature]
    return (f"{where}.{feature} does not exist: tfring does not provide "
            f"Horovod's {offered}. Instead, {instead}. (python -m "
            "tfring.migrate lists every such use in a script.)")


def attribute_error(module_name, name):
    """The AttributeError for `module_name.name` (module __getattr__)."""
    if name in FEATURES:
        return AttributeError(message(name, module_name))
    return AttributeError(
        f"module '{module_name}' has no attribute '{name}'")


class _UnsupportedFeatureFinder(importlib.abc.MetaPathFinder):
    """Turns `import tfring.<feature>` into an ImportError naming the
    replacement (instead of "No module named ...")."""

    _PACKAGES = ("tfring", "tfring.keras")

    def find_spec(self, fullname, path=None, target=None):
        package, _, feature = fullname.rpartition(".")
        if package in self._PACKAGES and feature in FEATURES:
            raise ImportError(message(feature, package), name=fullname)
        return None


def install_import_hook():
    if not any(isinstance(f, _UnsupportedFeatureFinder)
               for f in sys.meta_path):
        sys.meta_path.append(_UnsupportedFeatureFinder())
