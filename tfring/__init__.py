# tfring: Horovod-style distributed training for TensorFlow 2 / Keras 3 (and
# PyTorch: tfring.torch). A script written for horovod.tensorflow runs after
# changing its import to `import tfring as hvd`. This file only re-exports;
# each concern lives in its own module (basics, process_sets, collectives,
# compression, powersgd, functions, sync_batch_norm, tape, ops, mpi_ops).
#
# Why the API loads on first use: the tools in this package (`tfringrun`,
# `python -m tfring.timeline`) and the PyTorch front end (tfring.torch) never
# need TensorFlow, but Python runs this file before any of them (and a
# PyTorch process must not load TensorFlow: importing parts of torch after it
# crashes some torch releases). So `import tfring` binds only the names below;
# the first one used (`hvd.init`, `from tfring import allreduce`) imports the
# module that defines it, and with it TensorFlow and the version check
# (tfring/_version_check.py), whose ImportError then names both versions.

import importlib

from tfring._version import __version__
from tfring import _mpi_yield
from tfring import unsupported as _unsupported

_unsupported.install_import_hook()  # import tfring.spark: an error naming the replacement

# Open MPI yields the CPU instead of spinning while a rank waits, for this
# process's MPI only (tfring/_mpi_yield.py): set up before a script imports
# mpi4py, which starts MPI.
_mpi_yield.install_import_hook()

# Public name -> the module that defines it.
_API = {}
for _module, _names in {
    "basics": ["ccl_built", "cross_rank", "cross_size", "cuda_built", "data_path", "ddl_built",
               "gloo_built", "gloo_enabled", "init", "is_homogeneous", "is_initialized",
               "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
               "nccl_built", "rank", "rocm_built", "shm_enabled", "shutdown", "size",
               "start_timeline", "stop_timeline"],
    "alltoall_reducescatter": ["alltoall", "grouped_allgather", "grouped_reducescatter",
                               "reducescatter"],
    "reduce_args": ["Adasum", "Average", "Max", "Min", "Product", "Sum"],
    "collectives": ["allgather", "allreduce", "broadcast", "grouped_allreduce"],
    "compression": ["Compression"],
    "powersgd": ["PowerSGD"],
    "joining": ["join"],
    "sync_batch_norm": ["SyncBatchNormalization"],
    "functions": ["allgather_object", "broadcast_", "broadcast_global_variables",
                  "broadcast_object", "broadcast_variables"],
    "ops": ["local_rank_op", "local_size_op", "process_set_included_op", "rank_op", "size_op"],
    "process_sets": ["ProcessSet", "add_process_set", "global_process_set",
                     "remove_process_set"],
    "tape": ["DistributedGradientTape", "PartialDistributedGradientTape"],
    "keras.optimizer": ["DistributedOptimizer"],
}.items():
    _API.update((name, _module) for name in _names)
del _module, _names

# Submodules that `import tfring` made attributes before the API loaded
# lazily; mpi_ops is Horovod's module of that name (its internal `_basics`).
_SUBMODULES = {"elastic", "keras", "mpi_ops", "ops"}

__all__ = ["__version__", *sorted(_API)]


def __getattr__(name):
    if name in _API:
        value = getattr(importlib.import_module(f"tfring.{_API[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"tfring.{name}")
    else:
        # Horovod features tfring does not provide get an error naming the
        # replacement (tfring/unsupported.py); other names the usual one.
        raise _unsupported.attribute_error(__name__, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_API) | _SUBMODULES)
