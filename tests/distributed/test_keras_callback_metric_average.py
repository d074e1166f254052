# MetricAverageCallback at any number of ranks: every rank's epoch logs become
# the mean over ranks, in place, before later callbacks and History read
# them; non-numeric entries stay; differing metric names fail on every rank.

import numpy as np
import pytest
import keras

import tfring
from tfring.keras.callbacks import MetricAverageCallback


class Recorder(keras.callbacks.Callback):
    """Keeps a copy of the logs of every epoch end."""

    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def test_later_callbacks_and_history_see_the_mean(size, rank):
    keras.utils.set_random_seed(3)  # same model everywhere
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse",
                  metrics=["mae"])
    # Targets offset by rank, so every rank's metrics differ on purpose.
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(16, 2)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True) + 3.0 * rank
    before, after = Recorder(), Recorder()
    history = model.fit(
        x, y, batch_size=8, epochs=2, verbose=0,
        validation_data=(x[:8], y[:8] - rank),
        callbacks=[before, MetricAverageCallback(), after])

    gathered = tfring.allgather_object(before.logs)
    assert set(before.logs[0]) == {"loss", "mae", "val_loss", "val_mae"}
    if size > 1:
        assert gathered[0][0]["loss"] != gathered[1][0]["loss"]
    for epoch in range(2):
        for key, value in after.logs[epoch].items():
            expected = np.mean([g[epoch][key] for g in gathered])
            assert value == pytest.approx(expected, rel=1e-12), key
            assert isinstance(value, float)
            assert history.history[key][epoch] == value
    # Bit-identical on every rank.
    assert all(g == after.logs for g in tfring.allgather_object(after.logs))


def test_numbers_and_arrays_are_averaged_other_entries_kept(size, rank):
    logs = {"loss": float(rank), "count": rank, "f32": np.float32(2 * rank),
            "per_class": np.array([rank, 1.0], np.float32),
            "name": f"rank {rank}", "flag": rank == 0}
    MetricAverageCallback().on_epoch_end(0, logs)
    mean_rank = (size - 1) / 2
    assert logs["loss"] == mean_rank and isinstance(logs["loss"], float)
    assert logs["count"] == mean_rank
    assert logs["f32"] == 2 * mean_rank
    np.testing.assert_allclose(logs["per_class"], [mean_rank, 1.0])
    assert logs["per_class"].dtype == np.float32
    assert logs["name"] == f"rank {rank}" and logs["flag"] == (rank == 0)
    MetricAverageCallback().on_epoch_end(0, None)  # Nothing to average.


@pytest.mark.requires_ranks(2)
def test_different_metric_names_fail_on_every_rank(size, rank):
    logs = {"loss": 1.0}
    if rank == 0:
        logs["val_loss"] = 2.0
    others = list(range(1, size))
    with pytest.raises(ValueError) as error:
        MetricAverageCallback().on_epoch_end(4, logs)
    message = str(error.value)
    assert "end of epoch 5" in message
    assert "ranks [0]: loss, val_loss" in message
    assert f"ranks {others}: loss)" in message
    assert "Give every rank the same compile() metrics" in message
