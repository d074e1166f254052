# tfring.keras: the Keras 3 face of tfring (horovod.tensorflow.keras's
# place). This file only re-exports, except for the collectives below,
# which follow horovod.tensorflow.keras: they take Python/NumPy values and,
# eagerly, return NumPy arrays. `callbacks` is imported on first use.

import importlib

import tensorflow as tf

import tfring as _tfring
from tfring import (
    Adasum,
    Average,
    Compression,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather_object,
    broadcast_object,
    broadcast_variables,
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
)
from tfring.keras.optimizer import (DistributedLossScaleOptimizer,
                                    DistributedOptimizer,
                                    PartialDistributedOptimizer)
from tfring.keras.saving import load_model
from tfring.keras import fit_hook as _fit_hook

# model.fit() of a model compiled with a DistributedOptimizer joins ranks
# that run out of data (fit_hook.py). Here, not in optimizer.py: importing
# tfring.keras.optimizer (as tfring.DistributedOptimizer does) runs this
# package first.
_fit_hook.install()


def _result(tensor):
    return tensor.numpy() if tf.executing_eagerly() else tensor


def allreduce(value, name=None, average=None, prescale_factor=1.0,
              postscale_factor=1.0, op=None, compression=Compression.none):
    """Reduces a tensor-compatible value (number, list, NumPy array, tensor)
    over all ranks; default op is Average (`average` is deprecated).

    Returns a NumPy array eagerly (a tensor inside tf.function). `name`,
    when given, must be the same on every rank.
    """
    return _result(_tfring.allreduce(
        tf.convert_to_tensor(value), average=average, op=op,
        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        compression=compression, name=name))


def allgather(value, name=None):
    """Concatenates every rank's value along the first dimension; returns
    a NumPy array eagerly (a tensor inside tf.function)."""
    return _result(_tfring.allgather(tf.convert_to_tensor(value), name=name))


def broadcast(value, root_rank, name=None):
    """root_rank's value on every rank; a NumPy array eagerly (a tensor
    inside tf.function)."""
    return _result(_tfring.broadcast(tf.convert_to_tensor(value), root_rank,
                                     name=name))


def __getattr__(name):
    # tfring.keras.callbacks loads on first use, so tfring.keras imports
    # even where the callbacks are not needed (or not there).
    if name in ("callbacks", "elastic"):
        return importlib.import_module(f"tfring.keras.{name}")
    from tfring import unsupported
    raise unsupported.attribute_error(__name__, name)
