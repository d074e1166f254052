# tfring.keras: the Keras-facing namespace (horovod.tensorflow.keras's place).
# For now it re-exports the basics and collectives; DistributedOptimizer,
# callbacks and load_model come with the Keras issue.

from tfring import (
    Average,
    Compression,
    Sum,
    allgather,
    allreduce,
    broadcast,
    broadcast_object,
    broadcast_variables,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
