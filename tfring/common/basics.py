# The start-up, shut-down and topology queries every buffer front end
# (tfring.torch, tfring.mxnet) exports with Horovod's names.
#
# Why shared: the front ends run one core and one job (the same ranks,
# process sets and configuration); what each adds at init is restarting its
# own numbering (unnamed collectives, barriers), as Horovod does, so that
# every rank counts from the same point.

from tfring import basics as _basics
from tfring.basics import (  # noqa: F401  (re-exported by the front ends)
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


def start(comm, process_sets, restart_numbering):
    """Initializes tfring (see tfring.init) unless it runs already, then
    calls each of `restart_numbering`."""
    if _basics.is_initialized():
        return
    _basics.init(comm=comm, process_sets=process_sets)
    for restart in restart_numbering:
        restart()


def shutdown():
    """Stops the background thread on every rank; collectives in flight fail
    with HorovodInternalError. Safe to call more than once."""
    _basics.shutdown()
