# init(), shutdown() and the topology queries of tfring.torch.
#
# Why a thin layer over tfring.common.basics: what tfring.torch adds at init
# is restarting the numbering of unnamed collectives and barriers, as
# horovod.torch does, so every rank counts from the same point.

from tfring.common import basics as _common
from tfring.common.basics import *  # noqa: F401,F403  (re-exported)
from tfring.common.basics import shutdown  # noqa: F401
from tfring.torch import collectives as _collectives
from tfring.torch import join as _join


def init(comm=None, process_sets=None):
    """Initializes tfring (see tfring.init: `comm` an mpi4py communicator or
    a list of ranks, `process_sets` a list of ProcessSet or "dynamic") and
    starts the core's background thread. Calling it again while initialized
    does nothing."""
    _common.start(comm, process_sets, (_collectives.reset_names, _join.reset_barriers))
