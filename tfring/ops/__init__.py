"""tfring's TensorFlow ops: the native op library, thin wrappers, gradients.

Importing this package loads `libtfring_ops.so` (after `tfring._core`, so
both share one core) and registers the ops' gradients. The public API in
`tfring` builds on the wrappers re-exported here.
"""

from tfring.ops.collective_ops import allgather_op
from tfring.ops.collective_ops import allreduce_op
from tfring.ops.collective_ops import alltoall_op
from tfring.ops.collective_ops import broadcast_op
from tfring.ops.collective_ops import join_op
from tfring.ops.collective_ops import local_rank_op
from tfring.ops.collective_ops import local_size_op
from tfring.ops.collective_ops import process_set_included_op
from tfring.ops.collective_ops import process_set_rank_op
from tfring.ops.collective_ops import rank_op
from tfring.ops.collective_ops import reducescatter_op
from tfring.ops.collective_ops import size_op
from tfring.ops import gradients as _gradients  # Registers the gradients.

from tfring.ops.collective_ops import __all__  # the public wrappers
