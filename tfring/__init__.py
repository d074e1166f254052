# tfring: Horovod-style distributed training for TensorFlow 2 / Keras 3.
# A script written for horovod.tensorflow runs after changing its import to
# `import tfring as hvd`. This file only re-exports; each concern lives in its
# own module (basics, process_sets, collectives, compression, functions,
# sync_batch_norm, tape, ops, mpi_ops).

from tfring._version import __version__
from tfring.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    data_path,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
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
    shm_enabled,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from tfring.alltoall_reducescatter import (
    alltoall,
    grouped_allgather,
    grouped_reducescatter,
    reducescatter,
)
from tfring.collectives import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allreduce,
    broadcast,
    grouped_allreduce,
)
from tfring.compression import Compression
from tfring.join import join
# Horovod's module of that name, for its internal `_basics` (see there).
from tfring import mpi_ops
from tfring.sync_batch_norm import SyncBatchNormalization
from tfring.functions import (
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
)
from tfring.ops import (
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from tfring.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from tfring.tape import DistributedGradientTape, PartialDistributedGradientTape
from tfring.keras.optimizer import DistributedOptimizer
from tfring import unsupported as _unsupported

_unsupported.install_import_hook()


def __getattr__(name):
    # Only for names tfring lacks: Horovod features it does not provide get
    # an error naming the replacement (tfring/unsupported.py).
    raise _unsupported.attribute_error(__name__, name)
