# horovod.mxnet.mpi_ops' names, for scripts that import from that module.
# Only re-exports: the collectives live in collectives.py.

from tfring.mxnet.basics import *  # noqa: F401,F403
from tfring.mxnet.basics import init, shutdown  # noqa: F401
from tfring.mxnet.collectives import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    join,
    reducescatter,
)
from tfring.process_sets import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
