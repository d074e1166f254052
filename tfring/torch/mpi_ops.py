# horovod.torch.mpi_ops' names, for scripts that import from that module.
# Only re-exports: the collectives live in collectives.py (async, in place),
# autograd_functions.py (synchronous, differentiable) and join.py.

from tfring.torch.autograd_functions import (  # noqa: F401
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from tfring.torch.basics import *  # noqa: F401,F403
from tfring.torch.basics import init, shutdown  # noqa: F401
from tfring.torch.collectives import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
    sparse_allreduce_async,
)
from tfring.torch.handles import poll, synchronize  # noqa: F401
from tfring.torch.join import barrier, join  # noqa: F401
