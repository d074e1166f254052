# join(): training with a different number of batches on each rank.
# (The module is not named join.py: importing it would make the package
# attribute tfring.join this module instead of the function.)
#
# Why: with uneven data, a rank that runs out of batches would leave the
# others waiting forever in their next gradient allreduce. A rank that calls
# join() instead keeps taking part in the other ranks' allreduces with
# zeros (Average then divides by the ranks that contributed, as in Horovod)
# until every rank has joined. Other collectives cannot run meanwhile: they
# fail on the ranks that submitted them, naming the joined ranks.

import tensorflow as tf

from tfring import basics
from tfring import ops as _ops


@tf.autograph.experimental.do_not_convert
def join(device=''):
    """Blocks until every rank has joined; returns the last rank to join.

    Call it on each rank when that rank is out of data. Returns an int32
    scalar tensor, the same on every rank (use int(...) eagerly). Broadcast
    the model from that rank afterwards if the ranks' states must agree, e.g.
    tfring.broadcast_variables(model.variables, root_rank=int(last)).
    `device` is accepted for Horovod compatibility; join runs on the CPU.
    """
    del device
    basics._check_initialized("tfring.join()")
    with tf.device("/cpu:0"):
        return _ops.join_op()
