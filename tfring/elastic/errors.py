# The two exceptions that drive elastic training's run loop.
#
# Why a module of its own, with no imports: the TensorFlow, Keras and
# PyTorch front ends all raise and catch these, and a ported Horovod script
# catches them under Horovod's names (HorovodInternalError), so they must be
# importable without any framework.


class InternalError(RuntimeError):
    """A collective failed because a rank of the job died or the transport
    failed. Inside `tfring.elastic.run`, the run loop catches it, rolls the
    state back to the last commit, rebuilds the job over the surviving ranks
    and calls the training function again."""


# Horovod's name, so `except hvd.HorovodInternalError` in a ported script
# catches tfring's error.
HorovodInternalError = InternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed: raised by `state.commit()` /
    `state.check_host_updates()` on every rank at the same point. The run loop
    rebuilds the job with the new ranks and calls the training function again
    without rolling back (the state is current). `skip_sync` is True when only
    hosts were removed: the survivors' state is already the same everywhere."""

    def __init__(self, skip_sync=False):
        super().__init__(
            "tfring elastic: the job's hosts changed; the run loop resets the "
            "ranks and calls the training function again.")
        self.skip_sync = skip_sync
