# BestModelCheckpoint at any number of ranks: rank 0 saves the model when the
# monitored value improves; the other ranks never touch the file system.

import os

import numpy as np
import pytest
import keras

import tfring
from tfring.keras.callbacks import BestModelCheckpoint, MetricAverageCallback


def _model():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _forbid_saving_off_root(model, rank, monkeypatch):
    """Every rank but 0 fails the test if it saves or creates a folder."""
    if rank == 0:
        return

    def forbidden(*args, **kwargs):
        raise AssertionError(f"rank {rank} touched the file system")

    for name in ("save", "save_weights"):
        monkeypatch.setattr(model, name, forbidden)
    monkeypatch.setattr(os, "makedirs", forbidden)


def test_only_rank_zero_writes(tmp_path, size, rank, monkeypatch):
    model = _model()
    _forbid_saving_off_root(model, rank, monkeypatch)
    # Rank 0's path on every rank (as if on a shared file system) ...
    shared = tfring.broadcast_object(
        str(tmp_path / "ckpt" / "best-{epoch}.keras") if rank == 0 else None)
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(16, 2)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0,
              validation_data=(x[:8], y[:8]),
              callbacks=[MetricAverageCallback(),
                         BestModelCheckpoint(filepath=shared)])
    # ... and each rank's own folder: only rank 0's holds anything.
    written = sorted(os.listdir(tmp_path / "ckpt")) if rank == 0 else []
    assert os.listdir(tmp_path) == (["ckpt"] if rank == 0 else [])
    assert tfring.allgather_object(written)[1:] == [[]] * (size - 1)
    if rank == 0:
        # Loss falls every epoch on this problem: one file per epoch.
        assert written == ["best-1.keras", "best-2.keras", "best-3.keras"]
        loaded = keras.models.load_model(tmp_path / "ckpt" / written[-1])
        for got, want in zip(loaded.weights, model.weights):
            np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_saves_only_on_improvement(tmp_path, rank, monkeypatch):
    model = _model()
    saved = []
    monkeypatch.setattr(model, "save",
                        lambda path, **kwargs: saved.append(path))
    _forbid_saving_off_root(model, rank, monkeypatch)
    checkpoint = BestModelCheckpoint("val_accuracy", 0, False, "max",
                                     filepath=str(tmp_path / "{epoch}.keras"))
    assert checkpoint.save_best_only and checkpoint.monitor == "val_accuracy"
    checkpoint.set_model(model)
    for epoch, accuracy in enumerate([0.5, 0.4, 0.7, 0.7, 0.9]):
        checkpoint.on_epoch_begin(epoch)
        checkpoint.on_epoch_end(epoch, {"val_accuracy": accuracy})
    expected = [str(tmp_path / f"{e}.keras") for e in (1, 3, 5)]
    assert saved == (expected if rank == 0 else [])


def test_filepath_is_required():
    with pytest.raises(ValueError, match=r"BestModelCheckpoint received no "
                       r"filepath.*filepath='best.keras'"):
        BestModelCheckpoint(monitor="val_loss")
    with pytest.raises(ValueError, match=r"must end in `.keras`"):
        BestModelCheckpoint(filepath="best.txt")
