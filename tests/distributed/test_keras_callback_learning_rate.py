# LearningRateScheduleCallback and LearningRateWarmupCallback at any number of
# ranks: the learning rate of every batch, recorded by a callback after them,
# follows the formula; momentum correction scales the momentum buffers by
# lr'/lr exactly when the rate changes, which equals Goyal et al.'s corrected
# momentum coefficient; errors say what to pass.

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfring
from tfring.keras.callbacks import (LearningRateScheduleCallback,
                                    LearningRateWarmupCallback)

STEPS = 3  # batches per epoch
BATCH = 4


def _data(rank):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype(np.float32)
    return x, x @ np.array([[1.0], [-1.0], [2.0]], np.float32)


def _model(optimizer, run_eagerly=False):
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=run_eagerly)
    return model


def _buffers(optimizer, kind="momentum"):
    return [v.numpy() for v in optimizer.variables if v.path.endswith(kind)]


class Recorder(keras.callbacks.Callback):
    """Per batch: epoch, batch, learning rate, momentum buffers at its begin
    (after the callbacks before this one ran) and at its end."""

    def __init__(self, kind="momentum"):
        super().__init__()
        self.kind = kind
        self.rows = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.rows.append({
            "epoch": self.epoch, "batch": batch,
            "lr": float(optimizer.learning_rate.numpy()),
            "begin": _buffers(optimizer, self.kind)})

    def on_train_batch_end(self, batch, logs=None):
        self.rows[-1]["end"] = _buffers(self.model.optimizer, self.kind)


def _fit(model, callback, epochs, rank, recorder=None):
    recorder = recorder or Recorder()
    x, y = _data(rank)
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False,
                        verbose=0, callbacks=[callback, recorder])
    return recorder.rows, history


def _check_momentum_correction(rows, corrected=True):
    """Buffers entering batch k == buffers leaving batch k-1, times
    lr_k / lr_{k-1} with correction, unchanged without."""
    assert len(rows[-1]["begin"]) > 0
    for previous, row in zip(rows, rows[1:]):
        ratio = row["lr"] / previous["lr"] if corrected else 1.0
        for begin, end in zip(row["begin"], previous["end"]):
            np.testing.assert_allclose(begin, end * ratio, rtol=1e-6,
                                       atol=1e-9)


def _distributed(optimizer):
    wrapper = getattr(tfring, "DistributedOptimizer", None)
    if wrapper is None:
        pytest.skip("tfring.DistributedOptimizer is not available yet")
    return wrapper(optimizer)


@pytest.mark.parametrize("wrap", ["plain", "distributed"])
def test_warmup_learning_rate_per_batch(wrap, size, rank, capsys):
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    if wrap == "distributed":
        optimizer = _distributed(optimizer)
    model = _model(optimizer)
    warmup = LearningRateWarmupCallback(0.3, warmup_epochs=2, verbose=1)
    rows, history = _fit(model, warmup, epochs=3, rank=rank)

    assert len(rows) == 3 * STEPS
    for row in rows:
        epoch = row["epoch"] + row["batch"] / STEPS
        multiplier = (1.0 / size * (epoch * (size - 1) / 2 + 1)
                      if row["epoch"] < 2 else 1.0)
        assert row["lr"] == pytest.approx(0.3 * multiplier, rel=1e-6), row
    assert rows[0]["lr"] == pytest.approx(0.3 / size, rel=1e-6)
    assert rows[STEPS * 2]["lr"] == pytest.approx(0.3, rel=1e-7)
    _check_momentum_correction(rows)
    np.testing.assert_allclose(history.history["learning_rate"],
                               [rows[STEPS * e - 1]["lr"] for e in (1, 2, 3)],
                               rtol=1e-6)
    printed = capsys.readouterr().out
    assert ("Epoch 2: finished gradual learning rate warm-up" in printed) == (
        rank == 0), printed


class HorovodStyleCorrection(keras.callbacks.Callback):
    """The paper's correction as Horovod applied it: for a batch whose rate
    differs from the previous one, momentum coefficient m * lr'/lr, restored
    after the batch. Only works eagerly in Keras 3 (momentum is a float)."""

    def __init__(self, rates):
        super().__init__()
        self.rates = rates
        self.step = 0

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        old = float(optimizer.learning_rate.numpy())
        new = self.rates[self.step]
        optimizer.learning_rate.assign(new)
        self.restore = optimizer.momentum
        optimizer.momentum = self.restore * new / old

    def on_train_batch_end(self, batch, logs=None):
        self.model.optimizer.momentum = self.restore
        self.step += 1


def test_buffer_scaling_equals_corrected_momentum_coefficient(size, rank):
    rates = [0.02, 0.05, 0.04, 0.1, 0.1, 0.01]
    schedule = LearningRateScheduleCallback(
        1.0, lambda epoch: rates[round(epoch * STEPS)], staircase=False)
    compiled = _model(keras.optimizers.SGD(0.02, momentum=0.9))
    rows, _ = _fit(compiled, schedule, epochs=2, rank=rank)
    assert [r["lr"] for r in rows] == pytest.approx(rates, rel=1e-6)
    eager = _model(keras.optimizers.SGD(0.02, momentum=0.9), run_eagerly=True)
    _fit(eager, HorovodStyleCorrection(rates), epochs=2, rank=rank)
    for got, want in zip(compiled.weights, eager.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5,
                                   atol=1e-7)


@pytest.mark.parametrize("correction", [True, False])
def test_staircase_schedule_in_epoch_range(correction, size, rank):
    model = _model(keras.optimizers.SGD(0.07, momentum=0.5))
    schedule = LearningRateScheduleCallback(
        0.2, lambda epoch: 0.5 ** epoch, start_epoch=1, end_epoch=3,
        momentum_correction=correction)
    rows, history = _fit(model, schedule, epochs=4, rank=rank)
    per_epoch = {0: 0.07, 1: 0.1, 2: 0.05, 3: 0.05}
    for row in rows:
        assert row["lr"] == pytest.approx(per_epoch[row["epoch"]], rel=1e-6)
    _check_momentum_correction(rows, corrected=correction)
    np.testing.assert_allclose(history.history["learning_rate"],
                               [0.07, 0.1, 0.05, 0.05], rtol=1e-6)


def test_smooth_schedule_and_constant_multiplier(size, rank):
    model = _model(keras.optimizers.SGD(0.07, momentum=0.9))
    smooth = LearningRateScheduleCallback(
        0.2, lambda epoch: 1 + epoch, start_epoch=1, end_epoch=2,
        staircase=False)
    rows, _ = _fit(model, smooth, epochs=3, rank=rank)
    for row in rows:
        epoch = min(row["epoch"] + row["batch"] / STEPS, 1 + 2 / STEPS)
        want = 0.07 if row["epoch"] == 0 else 0.2 * (1 + epoch)
        assert row["lr"] == pytest.approx(want, rel=1e-6), row
    _check_momentum_correction(rows)

    constant = LearningRateScheduleCallback(0.2, 0.1, start_epoch=1)
    rows, _ = _fit(model, constant, epochs=2, rank=rank)
    assert [r["lr"] for r in rows] == pytest.approx(
        [0.2 * (2 + 2 / STEPS)] * STEPS + [0.02] * STEPS, rel=1e-6)


def test_rmsprop_momentum_buffers_scaled_not_its_averages(size, rank):
    model = _model(keras.optimizers.RMSprop(0.01, momentum=0.5))
    schedule = LearningRateScheduleCallback(0.01, lambda e: 2.0 ** e)
    rows, _ = _fit(model, schedule, epochs=2, rank=rank)
    _check_momentum_correction(rows)
    averages = Recorder(kind="velocity")
    rows, _ = _fit(model, schedule, epochs=2, rank=rank, recorder=averages)
    assert rows[STEPS]["lr"] == pytest.approx(0.02, rel=1e-6)
    _check_momentum_correction(rows, corrected=False)


def test_errors_say_what_to_pass(rank):
    with pytest.raises(TypeError, match=r"Expected a number or a function"):
        LearningRateScheduleCallback(0.1, "half")
    with pytest.raises(TypeError, match=r"initial_lr=None of type NoneType"):
        LearningRateWarmupCallback(None)

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    model = _model(keras.optimizers.SGD(decay))
    with pytest.raises(ValueError, match=r"Expected an optimizer created "
                       r"with a float learning rate"):
        _fit(model, LearningRateWarmupCallback(0.1), epochs=1, rank=rank)

    model = _model(keras.optimizers.SGD(0.1))
    x, y = _data(rank)

    def batches():
        for i in range(STEPS):
            yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]

    dataset = tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec((None, 3), tf.float32),
        tf.TensorSpec((None, 1), tf.float32)))
    with pytest.raises(ValueError, match=r"Pass steps_per_epoch=\.\.\. to "
                       r"LearningRateWarmupCallback or to fit\(\)"):
        model.fit(dataset, epochs=1, verbose=0,
                  callbacks=[LearningRateWarmupCallback(0.1)])
    # With steps_per_epoch given, the same dataset works.
    model.fit(dataset, epochs=1, verbose=0, callbacks=[
        LearningRateWarmupCallback(0.1, steps_per_epoch=STEPS)])
