# LearningRateWarmupCallback: gradual learning-rate warm-up for large
# effective batches (Goyal et al., 2017, "Accurate, Large Minibatch SGD").
#
# Why: with n ranks the effective batch is n times larger and the learning
# rate is scaled by n, but starting at that rate often diverges. The warm-up
# starts at initial_lr / n (the single-process rate) and grows linearly, per
# batch, to initial_lr after `warmup_epochs` epochs. It is a
# LearningRateScheduleCallback with a per-batch multiplier.

from tfring import basics
from tfring import collectives
from tfring.keras.callbacks.learning_rate_schedule import (
    LearningRateScheduleCallback)
from tfring.process_sets import global_process_set


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from `initial_lr / size` up to `initial_lr`.

    Before batch `b` of epoch `e` (with `steps` batches per epoch) and while
    `e < warmup_epochs`, the learning rate is `initial_lr * multiplier` with

        epoch = e + b / steps
        multiplier = 1 / size * (epoch * (size - 1) / warmup_epochs + 1)

    so the first batch runs at `initial_lr / size` and the rate grows by the
    same amount every batch. The first batch after the warm-up runs at
    exactly `initial_lr`, which stays until something else changes it.
    (Horovod shifts the ramp by one batch so that the last warm-up batch
    already runs at `initial_lr`; this follows the paper.) With one rank the
    rate is `initial_lr` throughout.

    Args:
        initial_lr: the learning rate after the warm-up, usually the
            single-process rate times `tfring.size()`.
        warmup_epochs: length of the warm-up in epochs.
        momentum_correction: scale momentum buffers by lr'/lr when the
            rate changes (see LearningRateScheduleCallback).
        steps_per_epoch: batches per epoch; None: taken from `fit()`.
        verbose: 1 prints a line on rank 0 (the set's lowest rank) when the
            warm-up ends.
        process_set: the tfring.ProcessSet that trains together (the
            DistributedOptimizer's); `size` above is its size (default:
            every rank, size = tfring.size()).

    Example:

    ```python
    optimizer = tfring.DistributedOptimizer(
        keras.optimizers.SGD(0.01 * tfring.size(), momentum=0.9))
    callbacks = [
        tfring.keras.callbacks.BroadcastGlobalVariablesCallback(0),
        tfring.keras.callbacks.MetricAverageCallback(),
        tfring.keras.callbacks.LearningRateWarmupCallback(
            0.01 * tfring.size(), warmup_epochs=3, verbose=1),
    ]
    ```
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0,
                 process_set=global_process_set):
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose
        self.process_set = process_set

        def multiplier(epoch):
            size = _set_size(process_set)
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if self._epoch == self.warmup_epochs and batch == 0:
            # The end point of the ramp: multiplier(warmup_epochs) == 1.
            self._set_learning_rate(self.initial_lr)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if (self.verbose and epoch == self.warmup_epochs - 1
                and basics.rank() == _first_rank(self.process_set)):
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate "
                  f"warm-up; from the next batch on the learning rate is "
                  f"{self.initial_lr:g}.", flush=True)


def _set_size(process_set):
    return collectives.resolve_process_set(
        process_set, "LearningRateWarmupCallback").size


def _first_rank(process_set):
    """The rank that prints: rank 0, or the set's lowest rank."""
    if process_set.process_set_id == 0 or not process_set.ranks:
        return 0
    return process_set.ranks[0]
