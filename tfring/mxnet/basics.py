# init(), shutdown() and the topology queries of tfring.mxnet.
#
# Why a thin layer over tfring.basics: every front end shares one core and
# one job; what tfring.mxnet adds at init is restarting the numbering of
# unnamed collectives, as horovod.mxnet does, so every rank counts from the
# same point.

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
from tfring.mxnet import collectives as _collectives


def init(comm=None, process_sets=None):
    """Initializes tfring (see tfring.init: `comm` an mpi4py communicator or
    a list of ranks, `process_sets` a list of ProcessSet or "dynamic") and
    starts the core's background thread. Calling it again while initialized
    does nothing."""
    if _basics.is_initialized():
        return
    _basics.init(comm=comm, process_sets=process_sets)
    _collectives.names.reset()


def shutdown():
    """Stops the background thread on every rank; collectives in flight fail
    with HorovodInternalError. Safe to call more than once."""
    _basics.shutdown()
