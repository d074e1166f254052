# Elastic training: ranks may die (and the job goes on over the survivors
# from the last in-memory commit) without restarting the job. Horovod's
# elastic API over Open MPI's fault tolerance (ULFM); see docs/elastic.md.
#
# Names load when first used: the launcher reads tfring.elastic.settings
# without starting MPI or the core, and PyTorch scripts never import
# TensorFlow through here.

import importlib

from tfring.elastic.errors import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, InternalError)

_LAZY = {
    "run_fn": "tfring.elastic.runner",
    "State": "tfring.elastic.state",
    "ObjectState": "tfring.elastic.state",
    "TensorFlowState": "tfring.elastic.tensorflow_state",
    "TensorFlowKerasState": "tfring.elastic.tensorflow_state",
}


def run(func):
    """Decorator: runs `func(state, ...)` in the elastic run loop (a failure
    rolls `state` back to its last commit on the survivors and calls `func`
    again; a host change calls it again without rollback)."""
    from tfring.elastic.runner import run_fn
    return run_fn(func)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfring.elastic' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
