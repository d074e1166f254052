# Saving and loading models whose optimizer is a tfring DistributedOptimizer:
# get_config/from_config, model.save + tfring.keras.load_model (state kept,
# optimizer wrapped, also for files saved with a plain optimizer or in mixed
# precision), and plain keras.models.load_model once tfring.keras is
# imported. Each rank writes and reads its own file.

import os
import shutil
import tempfile

import numpy as np
import pytest
import keras

import tfring
import tfring.keras as hvd_keras

LOCAL_BATCH = 4


@pytest.fixture
def workdir(rank):
    path = tempfile.mkdtemp(prefix=f"tfring_keras_saving_rank{rank}_")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _model(dtype=None):
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(3, activation="tanh", dtype=dtype),
        keras.layers.Dense(2, dtype=dtype),
    ])
    rng = np.random.RandomState(3)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def _data(rank, rows=4 * LOCAL_BATCH):
    rng = np.random.RandomState(100 + rank)
    return (rng.normal(size=(rows, 4)).astype(np.float32),
            rng.normal(size=(rows, 2)).astype(np.float32))


def _fit(model, rank, epochs=1):
    x, y = _data(rank)
    return model.fit(x, y, batch_size=LOCAL_BATCH, epochs=epochs,
                     shuffle=False, verbose=0)


def _values(variables):
    return [np.array(v.numpy()) for v in variables]


def _assert_all_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _assert_same_on_every_rank(model):
    for w in model.get_weights():
        every = hvd_keras.allgather(w[np.newaxis])
        assert (every == every[:1]).all()


def test_get_config_round_trip():
    optimizer = tfring.DistributedOptimizer(
        keras.optimizers.Adam(0.02, clipnorm=1.0), name="dist",
        compression=tfring.Compression.fp16, sparse_as_dense=True,
        backward_passes_per_step=3, average_aggregated_gradients=True,
        gradient_predivide_factor=2.0, groups=2)
    config = optimizer.get_config()
    for restored in (
            tfring.DistributedOptimizer.from_config(config),
            keras.optimizers.deserialize(
                keras.optimizers.serialize(optimizer))):
        assert type(restored) is tfring.DistributedOptimizer
        assert restored.get_config() == config
        assert restored.compression is tfring.Compression.fp16
        assert restored.inner_optimizer.clipnorm == 1.0
    assert config["op"] == int(tfring.Average)
    assert (keras.optimizers.serialize(optimizer)["registered_name"]
            == "tfring>DistributedOptimizer")
    summed = tfring.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                         op=tfring.Sum)
    assert (tfring.DistributedOptimizer.from_config(summed.get_config()).op
            == int(tfring.Sum))
    scaled = tfring.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=64.0))
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(scaled))
    assert type(restored) is hvd_keras.DistributedLossScaleOptimizer
    assert restored.initial_scale == 64.0


def test_save_and_load_keep_the_optimizer_state(workdir, size, rank):
    model = _model()
    model.compile(optimizer=tfring.DistributedOptimizer(
        keras.optimizers.Adam(0.01), backward_passes_per_step=3,
        average_aggregated_gradients=True), loss="mse")
    _fit(model, rank)  # 4 batches: one applied step, one pass accumulated
    path = os.path.join(workdir, "model.keras")
    model.save(path)

    loaded = hvd_keras.load_model(path, compression=tfring.Compression.fp16)
    optimizer = loaded.optimizer
    assert type(optimizer) is tfring.DistributedOptimizer
    assert optimizer.compression is tfring.Compression.fp16
    assert optimizer.backward_passes_per_step == 3
    assert int(optimizer.iterations) == 1
    # Adam's slots, iterations and the local gradient sums are all back.
    _assert_all_equal(_values(optimizer.variables),
                      _values(model.optimizer.variables))
    _assert_all_equal(loaded.get_weights(), model.get_weights())

    # Plain keras loads it too once tfring.keras is imported.
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is tfring.DistributedOptimizer
    _assert_all_equal(_values(plain.optimizer.variables),
                      _values(model.optimizer.variables))

    # Training goes on from the same state as the original's would.
    _fit(model, rank)
    _fit(loaded, rank)
    for g, w in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(g, w, rtol=1e-2, atol=1e-3)  # fp16 wire
    _assert_same_on_every_rank(loaded)


def test_load_model_wraps_a_plain_optimizer(workdir, size, rank):
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="mse", metrics=["mae"])
    _fit(model, rank=0)  # the same local training on every rank
    path = os.path.join(workdir, "plain.keras")
    model.save(path)

    loaded = hvd_keras.load_model(path)
    optimizer = loaded.optimizer
    assert type(optimizer) is tfring.DistributedOptimizer
    assert isinstance(optimizer.inner_optimizer, keras.optimizers.SGD)
    assert int(optimizer.iterations) == 4
    _assert_all_equal(_values(optimizer.variables),
                      _values(model.optimizer.variables))
    assert (loaded.get_compile_config()["optimizer"]["registered_name"]
            == "tfring>DistributedOptimizer")
    history = _fit(loaded, rank)
    assert "mae" in history.history
    _assert_same_on_every_rank(loaded)
    assert loaded.evaluate(*_data(rank), verbose=0)[0] >= 0.0


@pytest.fixture
def mixed_float16():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy(previous)


def test_load_mixed_precision_model(workdir, size, rank, mixed_float16):
    # Saved in mixed precision with a plain optimizer (compile() added the
    # LossScaleOptimizer). Keras itself restores that LossScaleOptimizer
    # only when the global policy is mixed_float16 again at load time.
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = _data(0)
    x[0, 0] = np.inf  # one skipped step: the loss scale halves
    model.fit(x, y, batch_size=LOCAL_BATCH, shuffle=False, verbose=0)
    assert model.optimizer.dynamic_scale.numpy() == 2.0 ** 14
    path = os.path.join(workdir, "mixed.keras")
    model.save(path)

    loaded = hvd_keras.load_model(path)
    optimizer = loaded.optimizer
    assert type(optimizer) is hvd_keras.DistributedLossScaleOptimizer
    assert optimizer.dynamic_scale.numpy() == 2.0 ** 14
    assert int(optimizer.iterations) == 3
    _fit(loaded, rank)
    assert int(optimizer.iterations) == 7
    _assert_same_on_every_rank(loaded)

    # Saved with the distributed optimizer, loaded by plain keras, now
    # under any policy (the file names the loss-scaling wrapper).
    path = os.path.join(workdir, "mixed_distributed.keras")
    loaded.save(path)
    keras.config.set_dtype_policy("float32")
    again = keras.models.load_model(path)
    assert type(again.optimizer) is hvd_keras.DistributedLossScaleOptimizer
    _assert_all_equal(_values(again.optimizer.variables),
                      _values(optimizer.variables))
