# SyncBatchNormalization: Keras 3 BatchNormalization whose training-mode
# batch statistics are those of the global batch, every rank's batch of the
# process set together (horovod.tensorflow.SyncBatchNormalization's place).
#
# Why: with small per-rank batches, per-rank statistics are noisy and differ
# between ranks; the model then trains on statistics of a batch that no
# single rank sees. Synchronizing them makes N ranks with batch b normalize
# exactly as one process would with the N*b concatenated batch.
#
# Why the `_moments` hook: in Keras 3, BatchNormalization.call() computes the
# training-mode batch statistics in exactly one place, `self._moments(inputs,
# mask)`, after upcasting float16/bfloat16 inputs to float32, and uses the
# result for everything else (normalization, the moving-average updates,
# batch renormalization). Overriding only that method keeps all of Keras'
# behaviour (inference with the moving statistics, masking, dtype policies,
# serialization). Horovod overrides the same hook of the Keras 2 layer.
# Keras' own `synchronized=True` cannot be used: it reduces over a
# tf.distribute replica context, which a tfring job does not have.

import inspect

import keras
import tensorflow as tf

from tfring import collectives
from tfring import process_sets as _process_sets
from tfring.process_sets import global_process_set

_API_NAME = "tfring.SyncBatchNormalization"


def _hook_problem():
    """Why the installed Keras lacks the hook this layer overrides, or None.

    Without it the layer would silently normalize with per-rank statistics,
    so construction fails instead.
    """
    hook = getattr(keras.layers.BatchNormalization, "_moments", None)
    if hook is None:
        return "keras.layers.BatchNormalization has no _moments method"
    params = list(inspect.signature(hook).parameters)
    if params != ["self", "inputs", "mask"]:
        return (f"keras.layers.BatchNormalization._moments takes {params}, "
                "not ['self', 'inputs', 'mask']")
    return None


_HOOK_PROBLEM = _hook_problem()


@keras.saving.register_keras_serializable(package="tfring")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with statistics synchronized across ranks.

    In training mode (`training=True` and a trainable layer) the mean and
    variance are those of the global batch: every rank's batch of
    `process_set` together, each rank weighted by its number of elements, so
    ranks may have different batch sizes (also zero rows). One Sum allreduce
    of (sum, sum of squares, count) per call; the variance is
    E[x^2] - E[x]^2, as in Horovod and in Keras' synchronized statistics,
    computed in float32 for float16/bfloat16 inputs as Keras does. Every
    rank of the set must call the layer in training mode together (as for
    any collective). Inference uses the moving statistics and no
    collective, exactly like keras.layers.BatchNormalization.

    Args:
      *args: those of keras.layers.BatchNormalization (axis, momentum,
        epsilon, ...).
      **kwargs: those of keras.layers.BatchNormalization (center, scale,
        initializers, renorm, ..., name, dtype).
      fused: accepted for Horovod compatibility; must be False (the
        default), as in Horovod (Keras 3 has no fused kernel).
      process_set: tfring extension: the tfring.ProcessSet whose ranks
        share statistics (default: every rank). Checked when the layer runs
        in training mode; not saved with the model (a loaded layer uses the
        global set).
    """

    def __init__(self, *args, fused=False, process_set=global_process_set,
                 **kwargs):
        if _HOOK_PROBLEM is not None:
            raise RuntimeError(
                f"{_API_NAME} needs the Keras 3 BatchNormalization._moments"
                f"(inputs, mask) hook, but {_HOOK_PROBLEM} (Keras "
                f"{keras.__version__}). Install a Keras version that tfring "
                "supports (3.x with that hook).")
        if fused is None or fused:
            raise ValueError(
                f"{_API_NAME} received fused={fused!r}. Expected "
                "fused=False (the default): a fused kernel computes the "
                "batch statistics itself, so they cannot be synchronized "
                "(Horovod refuses it too). Drop the fused argument.")
        if not isinstance(process_set, _process_sets.ProcessSet):
            raise TypeError(
                f"{_API_NAME} received process_set={process_set!r} of type "
                f"{type(process_set).__name__}. Expected a tfring.ProcessSet "
                "(default: tfring.global_process_set). Pass one of those.")
        super().__init__(*args, **kwargs)
        self._process_set = process_set

    @property
    def process_set(self):
        return self._process_set

    def _moments(self, inputs, mask):
        membership = _process_sets.resolve(self._process_set, _API_NAME)
        if membership.size == 1:
            # Nothing to synchronize: exactly Keras' (and Horovod's)
            # single-rank statistics.
            return super()._moments(inputs, mask)
        dtype = inputs.dtype
        x = inputs
        if dtype in (tf.float16, tf.bfloat16):  # call() upcasts already
            x = tf.cast(x, tf.float32)
        axes = self._reduction_axes
        if mask is None:
            local_sum = tf.reduce_sum(x, axis=axes)
            local_squares = tf.reduce_sum(tf.square(x), axis=axes)
            elements = tf.reduce_prod(tf.gather(tf.shape(x), axes))
            local_count = tf.fill(tf.shape(local_sum),
                                  tf.cast(elements, x.dtype))
        else:
            # Keras' masking: `mask` has one dimension less than inputs.
            weights = tf.cast(tf.broadcast_to(
                tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.shape(x)),
                x.dtype)
            local_sum = tf.reduce_sum(x * weights, axis=axes)
            local_squares = tf.reduce_sum(tf.square(x) * weights, axis=axes)
            local_count = tf.reduce_sum(weights, axis=axes)
        # Horovod's formula, with each rank weighted by its element count
        # (Horovod averages the ranks' means, which is the global mean only
        # when every rank has the same batch size).
        total_sum, total_squares, count = tf.unstack(collectives.allreduce(
            tf.stack([local_sum, local_squares, local_count]),
            op=collectives.Sum, name="sync_batch_norm",
            process_set=self._process_set))
        mean = tf.math.divide_no_nan(total_sum, count)
        variance = tf.maximum(
            tf.math.divide_no_nan(total_squares, count) - tf.square(mean),
            0.0)
        if mean.dtype != dtype:
            mean = tf.cast(tf.clip_by_value(mean, dtype.min, dtype.max),
                           dtype)
            variance = tf.cast(
                tf.clip_by_value(variance, dtype.min, dtype.max), dtype)
        return mean, variance
