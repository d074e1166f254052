# model.fit() with tfring.keras.DistributedOptimizer when ranks hold
# different numbers of batches: rank r has r + 2 batches per epoch. Every
# rank must finish every epoch (no stall), callbacks and metric averaging
# must keep working, and the final weights must equal a one-process run in
# which each step averages the gradients of the ranks that still had a
# batch. Eager and tf.function, data of known and of unknown length.

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfring
import tfring.keras as hvd_keras

FEATURES = 3
BATCH = 4
EPOCHS = 2
LEARNING_RATE = 0.0625  # exact in float32, the dtype of the learning rate


def _batches(rank):
    rng = np.random.default_rng(200 + rank)
    w_true = np.array([[1.0], [-2.0], [0.5]])
    x = rng.normal(size=((rank + 2) * BATCH, FEATURES))
    y = x @ w_true + 0.01 * rng.normal(size=(len(x), 1))
    return x, y


def _reference_weights(size):
    """One process: in each epoch, step k averages the gradients (of the
    mean squared error) of the ranks that have a batch k."""
    data = [_batches(r) for r in range(size)]
    w = np.zeros((FEATURES, 1))
    for _ in range(EPOCHS):
        for k in range(max(len(x) // BATCH for x, _ in data)):
            grads = []
            for x, y in data:
                xb, yb = x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]
                if len(xb):
                    grads.append(2.0 * xb.T @ (xb @ w - yb) / len(xb))
            w = w - LEARNING_RATE * np.mean(grads, axis=0)
    return w


def _dataset(rank, known_length):
    dataset = tf.data.Dataset.from_tensor_slices(_batches(rank)).batch(BATCH)
    if not known_length:
        # Keras then learns the epoch's length from the end of the data.
        dataset = dataset.filter(lambda x, y: True)
    return dataset


class _EpochCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs_ended = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_ended += 1


@pytest.mark.parametrize("run_eagerly", [False, True],
                         ids=["function", "eager"])
@pytest.mark.parametrize("known_length", [True, False],
                         ids=["known_length", "unknown_length"])
def test_fit_with_uneven_batches_matches_single_process(
        run_eagerly, known_length, rank, size):
    model = keras.Sequential([
        keras.Input((FEATURES,), dtype="float64"),
        keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros",
                           dtype="float64"),
    ])
    model.compile(
        optimizer=hvd_keras.DistributedOptimizer(
            keras.optimizers.SGD(LEARNING_RATE)),
        loss="mse", run_eagerly=run_eagerly)
    counter = _EpochCounter()
    x_val, y_val = _batches(0)
    history = model.fit(
        _dataset(rank, known_length), epochs=EPOCHS, verbose=0,
        validation_data=(x_val, y_val),
        callbacks=[hvd_keras.callbacks.MetricAverageCallback(), counter])

    assert counter.epochs_ended == EPOCHS
    # Keras computes the loss in float32 (its default floatx); a wrong
    # divisor or a missed step would be off by far more than that.
    np.testing.assert_allclose(
        model.get_weights()[0], _reference_weights(size), rtol=1e-5,
        err_msg=f"rank {rank} of {size}")
    # The ranks that joined early took the optimizer state of the last one,
    # and the metrics were averaged over the ranks: identical everywhere.
    final = np.array([history.history["loss"][-1],
                      history.history["val_loss"][-1],
                      float(model.optimizer.iterations.numpy())])
    everyone = tfring.allgather(tf.constant([final])).numpy()
    np.testing.assert_array_equal(everyone, np.repeat([final], size, axis=0))


def test_fit_with_even_batches_broadcasts_nothing(rank, size):
    # Equal data: the join callback finds equal step counts and leaves the
    # per-rank state alone (a non-trainable weight that differs per rank
    # stays different).
    model = keras.Sequential([
        keras.Input((FEATURES,), dtype="float64"),
        keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros",
                           dtype="float64"),
    ])
    marker = model.add_weight(shape=(), initializer="zeros",
                              trainable=False, dtype="float64", name="marker")
    marker.assign(float(rank))
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(LEARNING_RATE)), loss="mse")
    model.fit(_dataset(0, True), epochs=1, verbose=0)
    assert float(marker.numpy()) == float(rank)
