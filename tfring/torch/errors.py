# Exceptions of tfring.torch, with horovod.torch's names.
#
# Why a module of its own: a collective that the core fails (ranks that
# disagree about a tensor, a shutdown, a dead peer) reaches PyTorch code in
# synchronize(), where Horovod raises HorovodInternalError (a RuntimeError).
# Scripts that catch it keep working; the message is the core's, which names
# the tensor, the field and the ranks.


class HorovodInternalError(RuntimeError):
    """A collective failed in the core (the message says why and where).

    Raised by synchronize() (and the synchronous collectives) on every rank
    the failure concerns; later collectives still work unless the job was
    aborted (a rank died or shut down).
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-training interrupt. tfring has no elastic mode and
    never raises it; defined so that `except` clauses naming it still work."""
