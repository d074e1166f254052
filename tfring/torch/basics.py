# init(), shutdown() and the topology queries of tfring.torch.
#
# Why a thin layer over tfring.basics: PyTorch and TensorFlow front ends share
# one core and one job (the same ranks, process sets and configuration);
# what tfring.torch adds at init is restarting the numbering of unnamed
# collectives, as horovod.torch does, so every rank counts from the same
# point.

from tfring import basics as _basics
from tfring.basics import (  # noqa: F401  (re-exported)
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
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
    size,
    start_timeline,
    stop_timeline,
)
from tfring.torch import collectives as _collectives
from tfring.torch import join as _join


def init(comm=None, process_sets=None):
    """Initializes tfring (see tfring.init: `comm` an mpi4py communicator or
    a list of ranks, `process_sets` a list of ProcessSet or "dynamic") and
    starts the core's background thread. Calling it again while initialized
    does nothing."""
    if _basics.is_initialized():
        return
    _basics.init(comm=comm, process_sets=process_sets)
    _collectives.reset_names()
    _join.reset_barriers()


def shutdown():
    """Stops the background thread on every rank; collectives in flight fail
    with HorovodInternalError. Safe to call more than once."""
    _basics.shutdown()
