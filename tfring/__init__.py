# tfring: Horovod-style distributed training for TensorFlow 2 / Keras 3 (and
# PyTorch: tfring.torch). A script written for horovod.tensorflow runs after
# changing its import to `import tfring as hvd`. This file only re-exports;
# each concern lives in its own module (basics, process_sets, collectives,
# compression, functions, sync_batch_norm, tape, ops, mpi_ops).
#
# The TensorFlow front end is loaded on first use of one of its names
# (PEP 562 module __getattr__), not by `import tfring`: tfring.torch shares
# the package, and a PyTorch process must not load TensorFlow (besides the
# time and memory, importing parts of torch after TensorFlow crashes some
# torch releases). The TensorFlow-free basics load at once.

import importlib as _importlib

from tfring._version import __version__
from tfring.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    data_path,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shm_enabled,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from tfring.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from tfring.reduce_args import Adasum, Average, Max, Min, Product, Sum

# name -> the module (TensorFlow front end) it is re-exported from.
_TENSORFLOW_NAMES = {
    **dict.fromkeys(["alltoall", "grouped_allgather", "grouped_reducescatter",
                     "reducescatter"], "tfring.alltoall_reducescatter"),
    **dict.fromkeys(["allgather", "allreduce", "broadcast",
                     "grouped_allreduce"], "tfring.collectives"),
    "Compression": "tfring.compression",
    "join": "tfring.join",
    "SyncBatchNormalization": "tfring.sync_batch_norm",
    **dict.fromkeys(["allgather_object", "broadcast_",
                     "broadcast_global_variables", "broadcast_object",
                     "broadcast_variables"], "tfring.functions"),
    **dict.fromkeys(["local_rank_op", "local_size_op",
                     "process_set_included_op", "rank_op", "size_op"],
                    "tfring.ops"),
    **dict.fromkeys(["DistributedGradientTape",
                     "PartialDistributedGradientTape"], "tfring.tape"),
    "DistributedOptimizer": "tfring.keras.optimizer",
}
# Submodules scripts reach as attributes without importing them
# (Horovod's mpi_ops for its internal `_basics`).
_SUBMODULES = ("mpi_ops", "ops", "keras")


def __getattr__(name):
    if name in _TENSORFLOW_NAMES:
        value = getattr(_importlib.import_module(_TENSORFLOW_NAMES[name]),
                        name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f"tfring.{name}")
    else:
        raise AttributeError(f"module 'tfring' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_TENSORFLOW_NAMES) | set(_SUBMODULES))
