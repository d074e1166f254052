# LearningRateScheduleCallback: sets the optimizer's learning rate to
# `initial_lr * multiplier(epoch)` inside an epoch range, once per epoch
# (staircase) or before every batch with a fractional epoch.
#
# Why momentum correction scales the momentum buffers: Goyal et al. (2017)
# correct momentum SGD when the learning rate changes from lr to lr' by
# using the momentum coefficient m * lr'/lr for that one step. Horovod did
# this by changing `optimizer.momentum` for a step and restoring it. In
# Keras 3 `momentum` is a Python float that is baked into the traced train
# step, so changing it afterwards has no effect. For SGD (v <- m*v - lr*g)
# and RMSprop (whose momentum buffer is also in units of lr * update) the same
# correction is scaling the momentum buffers by lr'/lr before the step,
# which works inside compiled train steps and needs no restore.

import numbers

import keras
import tensorflow as tf

# Attributes holding the momentum buffers, in units of lr * update: SGD's
# `momentums`, RMSprop's `_momentums` (not its `_velocities`, which average
# squared gradients).
_MOMENTUM_BUFFER_ATTRIBUTES = ("momentums", "_momentums")


def _optimizers(optimizer):
    """`optimizer` and the optimizers it wraps, outermost first."""
    chain, seen = [], set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        chain.append(optimizer)
        # Where wrappers keep the wrapped optimizer: LossScaleOptimizer and
        # tfring.DistributedOptimizer.
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return chain


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier` for some epochs.

    With `staircase=True` the learning rate is set at the beginning of every
    epoch `e` with `start_epoch <= e < end_epoch` to
    `initial_lr * multiplier(e)`. With `staircase=False` it is set before
    every batch of those epochs to `initial_lr * multiplier(e + b / steps)`
    for batch `b` of `steps` per epoch. Outside the range the learning rate
    is left as it is. The value of the last epoch is added to the epoch logs
    as `learning_rate`.

    The optimizer must have a settable learning rate (created with a float
    `learning_rate`, not a `LearningRateSchedule`). It may be a
    tfring.DistributedOptimizer or another wrapper.

    Args:
        initial_lr: the learning rate the multiplier scales.
        multiplier: a number, or a function of the epoch (an int with
            `staircase=True`, a float otherwise) returning one.
        start_epoch: first epoch of the range (inclusive).
        end_epoch: end of the range (exclusive); None: no end.
        staircase: adjust once per epoch (True) or before every batch.
        momentum_correction: when the learning rate changes from lr to lr',
            scale the optimizer's momentum buffers by lr'/lr (Goyal et al.,
            2017), for optimizers with a nonzero `momentum` (SGD, RMSprop).
        steps_per_epoch: batches per epoch, for `staircase=False`; None:
            taken from `fit()`.

    Example:

    ```python
    # Divide the learning rate by 10 from epoch 30 and by 100 from epoch 60.
    callbacks = [
        LearningRateScheduleCallback(0.1 * tfring.size(), 0.1,
                                     start_epoch=30, end_epoch=60),
        LearningRateScheduleCallback(0.1 * tfring.size(), 0.01,
                                     start_epoch=60),
    ]
    ```
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True,
                 steps_per_epoch=None):
        super().__init__()
        if isinstance(initial_lr, bool) or not isinstance(initial_lr,
                                                          numbers.Real):
            raise TypeError(
                f"{type(self).__name__} received initial_lr={initial_lr!r} "
                f"of type {type(initial_lr).__name__}. Expected a number: "
                "the learning rate the schedule scales. Pass e.g. "
                "initial_lr=0.01 * tfring.size().")
        self.initial_lr = initial_lr
        if callable(multiplier):
            self.multiplier = multiplier
        elif isinstance(multiplier, numbers.Real):
            self.multiplier = lambda epoch: multiplier
        else:
            raise TypeError(
                f"{type(self).__name__} received multiplier={multiplier!r} "
                f"of type {type(multiplier).__name__}. Expected a number or "
                "a function of the epoch returning one. Pass e.g. "
                "multiplier=0.1 or multiplier=lambda epoch: 0.5 ** epoch.")
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self._steps = steps_per_epoch
        self._epoch = None
        self._scale_function = None
        self._scale_variables = None

    # Learning rate access, through wrappers such as DistributedOptimizer.

    def _learning_rate_variable(self):
        optimizer = self.model.optimizer
        learning_rate = getattr(optimizer, "learning_rate", None)
        if not hasattr(learning_rate, "assign"):
            raise ValueError(
                f"{type(self).__name__} cannot set the learning rate of "
                f"{type(optimizer).__name__}: its learning_rate is "
                f"{learning_rate!r}, not a variable. Expected an optimizer "
                "created with a float learning rate. Create it with e.g. "
                "learning_rate=0.01 instead of a LearningRateSchedule or a "
                "callable, and let this callback change it.")
        return learning_rate

    def _current_lr(self):
        return float(self._learning_rate_variable().numpy())

    def _momentum_buffers(self):
        """The momentum buffer variables, or [] if there are none."""
        for optimizer in _optimizers(self.model.optimizer):
            momentum = getattr(optimizer, "momentum", None)
            if not isinstance(momentum, numbers.Real) or momentum == 0:
                continue
            for name in _MOMENTUM_BUFFER_ATTRIBUTES:
                buffers = getattr(optimizer, name, None)
                if isinstance(buffers, (list, tuple)):
                    return [v for v in buffers if v is not None]
        return []

    def _scale_momentum_buffers(self, ratio):
        variables = self._momentum_buffers()
        if not variables:
            return
        if self._scale_variables is None or len(variables) != len(
                self._scale_variables) or any(
                    a is not b for a, b in zip(variables,
                                               self._scale_variables)):
            # One traced function per variable list: all scalings run as
            # one call instead of one eager op per variable and batch.
            def scale(r):
                for v in variables:
                    v.assign(v * tf.cast(r, v.dtype))

            self._scale_function = tf.function(scale, autograph=False)
            self._scale_variables = variables
        self._scale_function(tf.constant(ratio, tf.float64))

    def _adjust_learning_rate(self, epoch):
        self._set_learning_rate(self.initial_lr * self.multiplier(epoch))

    def _set_learning_rate(self, new_lr):
        new_lr = float(new_lr)
        old_lr = self._current_lr()
        self._learning_rate_variable().assign(new_lr)
        if self.momentum_correction and old_lr != 0 and new_lr != old_lr:
            self._scale_momentum_buffers(new_lr / old_lr)

    def _in_range(self, epoch):
        return self.start_epoch <= epoch and (
            self.end_epoch is None or epoch < self.end_epoch)

    # Keras hooks.

    def on_train_begin(self, logs=None):
        self._learning_rate_variable()  # Fail early with a clear message.
        if self.staircase:
            return
        self._steps = self.steps_per_epoch or self.params.get("steps")
        if not self._steps:
            raise ValueError(
                f"{type(self).__name__} with staircase=False needs the number "
                "of batches per epoch, but fit() does not know it (the "
                "dataset's length is unknown). Expected steps_per_epoch. "
                f"Pass steps_per_epoch=... to {type(self).__name__} or to "
                "fit().")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._adjust_learning_rate(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self._epoch):
            return
        self._adjust_learning_rate(self._epoch + batch / self._steps)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = self._current_lr()
