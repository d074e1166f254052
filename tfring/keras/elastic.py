# Elastic training for Keras model.fit: the state of a model and the
# callbacks that keep it current and committed.
#
# Why: model.fit owns the loop, so the commits and the epoch/batch counters
# that tfring.elastic.run restarts from come from callbacks, as in
# Horovod's horovod.tensorflow.keras.elastic.

import keras

from tfring.elastic import run  # noqa: F401 (tfring.keras.elastic.run)
from tfring.elastic.tensorflow_state import TensorFlowKerasState


class KerasState(TensorFlowKerasState):
    """A Keras model and optimizer plus attributes given as keyword
    arguments (`epoch=0, batch=0`), committed and restored together."""


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches (a failure rolls
    back to the last commit; commit() also raises HostsUpdatedInterrupt when
    hosts changed)."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(
                f"CommitStateCallback(batches_per_commit={batches_per_commit})"
                " received a count below 1. Expected 1 or more batches "
                "between commits. Pass a positive integer.")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._batches_left = batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self._batches_left -= 1
        if self._batches_left == 0:
            self.state.commit()
            self._batches_left = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps `state.batch` at the number of batches done in this epoch (0
    at each epoch's end)."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Counts finished epochs in `state.epoch` (one more at each epoch's
    end): call `model.fit(..., epochs=epochs - state.epoch)` so a restart
    runs only the epochs left, as in Horovod's examples."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch += 1
