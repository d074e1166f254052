# BestModelCheckpoint: keras.callbacks.ModelCheckpoint with
# save_best_only=True that only rank 0 runs.
#
# Why only rank 0: after the first step every rank holds the same model, so
# one copy is enough, and ranks writing the same path (on a shared file
# system) would race. Ranks other than 0 never touch the file system: they
# skip the saving hooks entirely, including creating the directory.

import keras

from tfring import basics


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Saves the model whenever `monitor` improves, on rank 0 only.

    The positional arguments follow Horovod's BestModelCheckpoint. Keras 3
    needs the path when the checkpoint is created, so `filepath` is a
    required keyword argument: it must end in `.keras` (or `.weights.h5`
    with `save_weights_only=True`) and may contain `{epoch}` and metric
    placeholders, as in ModelCheckpoint.

    Rank 0 decides with its own `logs`: put MetricAverageCallback before
    this callback so that "best" refers to the metric averaged over ranks.

    Args:
        monitor: the metric to watch, e.g. "val_loss" or "val_accuracy".
        verbose: 1 prints a line on rank 0 when saving.
        save_weights_only: save only the weights (`model.save_weights`).
        mode: "auto", "min" or "max": whether smaller or larger is better.
        save_freq: "epoch", or an integer number of batches between checks
            (then rank 0's own batch logs decide).
        filepath: where rank 0 saves the model.
        initial_value_threshold: only save once `monitor` beats this value.

    Example:

    ```python
    callbacks = [
        tfring.keras.callbacks.MetricAverageCallback(),
        tfring.keras.callbacks.BestModelCheckpoint(filepath="best.keras"),
    ]
    ```
    """

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False,
                 mode="auto", save_freq="epoch", *, filepath=None,
                 initial_value_threshold=None):
        if filepath is None:
            raise ValueError(
                "BestModelCheckpoint received no filepath. Keras 3's "
                "ModelCheckpoint needs the path when it is created (Horovod "
                "set it later). Expected a path ending in .keras (or "
                ".weights.h5 with save_weights_only=True). Pass e.g. "
                "BestModelCheckpoint(monitor='val_loss', "
                "filepath='best.keras').")
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose,
                         save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq,
                         initial_value_threshold=initial_value_threshold)

    @staticmethod
    def _is_writer():
        basics._check_initialized("BestModelCheckpoint")
        return basics.rank() == 0

    def on_train_batch_end(self, batch, logs=None):
        if self._is_writer():
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self._is_writer():
            super().on_epoch_end(epoch, logs)
