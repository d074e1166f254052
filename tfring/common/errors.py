# Exceptions of the buffer front ends (tfring.torch, tfring.mxnet), with
# Horovod's names.
#
# Why a module of its own: a collective that the core fails (ranks that
# disagree about a tensor, a shutdown, a dead peer) reaches the framework
# code where Horovod raises HorovodInternalError (a RuntimeError). Scripts
# that catch it keep working; the message is the core's, which names the
# tensor, the field and the ranks.


from tfring.elastic.errors import HostsUpdatedInterrupt  # noqa: F401 (re-exported)
from tfring.elastic.errors import InternalError as _ElasticInternalError


class HorovodInternalError(_ElasticInternalError):
    """A collective failed in the core (the message says why and where).

    Raised (by synchronize() or a synchronous collective) on every rank the
    failure concerns; later collectives still work unless the job was
    aborted (a rank died or shut down).
    """


class InvalidArgumentError(HorovodInternalError, ValueError):
    """A collective's arguments were invalid on at least one rank (e.g.
    alltoall splits that do not add up), found when the ranks compared them:
    raised on every rank of the collective, none of which ran it. Also a
    ValueError, the type Horovod raises for these arguments."""
