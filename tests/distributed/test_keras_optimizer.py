# tfring.keras.DistributedOptimizer at any number of ranks. The yardstick is
# always the same: n ranks, each fed its contiguous shard of every global
# batch, must end with the weights one process gets from the whole global
# batch with the plain optimizer (computed here, on every rank). That covers
# model.fit with SGD+momentum and Adam, backward_passes_per_step, custom
# loops, clipping (which must see averaged gradients), Embedding gradients,
# the inner gradient_accumulation_steps and mixed precision, including a
# step where only rank 0's gradients overflow.

import importlib.util

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfring
import tfring.keras as hvd_keras
from tfring import collectives

EPOCHS = 2
LOCAL_BATCH = 4
STEPS_PER_EPOCH = 2


def _weights_like(model, seed):
    rng = np.random.RandomState(seed)
    return [rng.uniform(-0.5, 0.5, size=w.shape).astype(np.float32)
            for w in model.get_weights()]


def _dense_model(seed=1, dtype=None):
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(3, activation="tanh", dtype=dtype),
        keras.layers.Dense(2, dtype=dtype),
    ])
    model.set_weights(_weights_like(model, seed))
    return model


def _embedding_model(seed=1):
    model = keras.Sequential([
        keras.Input((3,), dtype="int32"),
        keras.layers.Embedding(10, 4),
        keras.layers.Flatten(),
        keras.layers.Dense(2),
    ])
    model.set_weights(_weights_like(model, seed))
    return model


def _global_data(size, passes=1, seed=7, embedding=False):
    """Every rank builds the same data: STEPS_PER_EPOCH global batches of
    size * passes * LOCAL_BATCH rows."""
    rows = STEPS_PER_EPOCH * size * passes * LOCAL_BATCH
    rng = np.random.RandomState(seed)
    if embedding:
        x = rng.randint(0, 10, size=(rows, 3)).astype(np.int32)
    else:
        x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = rng.normal(size=(rows, 2)).astype(np.float32)
    return x, y


def _shard(array, size, rank, passes=1):
    """Rank's contiguous part of each global batch (passes micro-batches)."""
    part = passes * LOCAL_BATCH
    global_batch = size * part
    return np.concatenate([
        array[start + rank * part:start + (rank + 1) * part]
        for start in range(0, len(array), global_batch)])


def _fit(model, optimizer, x, y, batch_size, epochs=EPOCHS):
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False,
              verbose=0)
    return model


def _assert_same_weights(got, want, tol=1e-5):
    for g, w in zip(got.get_weights(), want.get_weights()):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _check_fit_equivalence(size, rank, make_inner, passes=1,
                           make_model=_dense_model, embedding=False,
                           tol=1e-5, **kwargs):
    x, y = _global_data(size, passes, embedding=embedding)
    model = _fit(make_model(),
                 tfring.DistributedOptimizer(
                     make_inner(), backward_passes_per_step=passes, **kwargs),
                 _shard(x, size, rank, passes), _shard(y, size, rank, passes),
                 LOCAL_BATCH)
    reference = _fit(make_model(), make_inner(), x, y,
                     size * passes * LOCAL_BATCH)
    _assert_same_weights(model, reference, tol)
    return model, reference


def _sgd(**kwargs):
    return lambda: keras.optimizers.SGD(0.1, momentum=0.9, **kwargs)


def _adam():
    return keras.optimizers.Adam(0.01)


@pytest.mark.parametrize("make_inner", [_sgd(), _adam], ids=["sgd", "adam"])
def test_fit_matches_one_process_with_global_batch(make_inner, size, rank):
    model, reference = _check_fit_equivalence(size, rank, make_inner)
    assert int(model.optimizer.iterations) == EPOCHS * STEPS_PER_EPOCH
    # evaluate() works with the wrapped optimizer and sees the same model.
    x, y = _global_data(size)
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0),
                               reference.evaluate(x, y, verbose=0),
                               rtol=1e-5)


@pytest.mark.parametrize("make_inner", [_sgd(), _adam], ids=["sgd", "adam"])
def test_backward_passes_match_a_k_times_larger_batch(make_inner, size,
                                                      rank):
    model, _ = _check_fit_equivalence(size, rank, make_inner, passes=2,
                                      average_aggregated_gradients=True)
    # The inner optimizer counts applied steps, as the reference does.
    assert int(model.optimizer.iterations) == EPOCHS * STEPS_PER_EPOCH


def test_inner_gradient_accumulation_steps(size, rank):
    # (With a predivision on the way, which must not change the average.)
    _check_fit_equivalence(size, rank, _sgd(gradient_accumulation_steps=2),
                           gradient_predivide_factor=2.0)


@pytest.mark.parametrize("clip", ["clipnorm", "global_clipnorm",
                                  "clipvalue"])
def test_clipping_sees_the_averaged_gradients(clip, size, rank):
    # The limit is below the gradient's norm, so every step is clipped; the
    # reference clips the global batch's gradient (= the average).
    x, y = _global_data(size)
    model = _dense_model()
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x))
    norm = tf.linalg.global_norm(
        tape.gradient(loss, model.trainable_variables))
    limit = 0.05
    assert float(norm) > 4 * limit
    _check_fit_equivalence(
        size, rank, lambda: keras.optimizers.SGD(0.5, **{clip: limit}))


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_embedding_gradients(sparse_as_dense, size, rank, monkeypatch):
    gathered = []
    original = collectives._gather_slices

    def spy(*args, **kwargs):
        gathered.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(collectives, "_gather_slices", spy)
    _check_fit_equivalence(size, rank, _sgd(), make_model=_embedding_model,
                           embedding=True, sparse_as_dense=sparse_as_dense)
    # IndexedSlices travel as slices (allgather) unless sparse_as_dense.
    assert bool(gathered) != sparse_as_dense


@pytest.mark.parametrize("mode,call,passes", [
    ("eager", "apply", 1),
    ("function", "apply_gradients", 1),
    ("eager", "apply_gradients", 2),
    ("function", "apply", 2),
])
def test_custom_loop(mode, call, passes, size, rank):
    x, y = _global_data(size, passes)
    mse = keras.losses.MeanSquaredError()

    def train(model, optimizer, xs, ys, batch):
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = mse(yb, model(xb))
            grads = tape.gradient(loss, model.trainable_variables)
            if call == "apply":
                optimizer.apply(grads, model.trainable_variables)
            else:
                optimizer.apply_gradients(
                    zip(grads, model.trainable_variables))

        if mode == "function":
            step = tf.function(step)
        for start in range(0, len(xs), batch):
            step(xs[start:start + batch], ys[start:start + batch])
        return model

    optimizer = tfring.DistributedOptimizer(
        _sgd()(), groups=2, backward_passes_per_step=passes,
        average_aggregated_gradients=True)
    model = train(_dense_model(), optimizer, _shard(x, size, rank, passes),
                  _shard(y, size, rank, passes), LOCAL_BATCH)
    reference = train(_dense_model(), _sgd()(), x, y,
                      size * passes * LOCAL_BATCH)
    _assert_same_weights(model, reference)


def test_unconnected_variable_keeps_a_none_gradient(size, rank):
    used = keras.Variable([1.0, 2.0])
    unused = keras.Variable([3.0])
    optimizer = tfring.DistributedOptimizer(keras.optimizers.SGD(0.5))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(used * float(rank + 1))
    grads = tape.gradient(loss, [used, unused])
    assert grads[1] is None
    optimizer.apply_gradients(zip(grads, [used, unused]))
    mean = np.mean(np.arange(1, size + 1))
    np.testing.assert_allclose(used.numpy(), [1.0 - 0.5 * mean,
                                              2.0 - 0.5 * mean], rtol=1e-6)
    np.testing.assert_allclose(unused.numpy(), [3.0])


# --- mixed precision ------------------------------------------------------

@pytest.fixture
def mixed_float16():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy(previous)


def test_mixed_precision_skips_a_step_on_every_rank_together(
        mixed_float16, size, rank):
    # The first global batch's first row is inf: only rank 0 has it, so only
    # rank 0's local gradients are not finite. Every rank must skip that
    # step and halve the loss scale, as one process with the global batch
    # does (with the LossScaleOptimizer outside, the other ranks would wait
    # for rank 0 in the allreduce forever).
    x, y = _global_data(size)
    x[0, 0] = np.inf
    inner = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer = tfring.DistributedOptimizer(inner)
    assert isinstance(optimizer, tfring.keras.DistributedLossScaleOptimizer)
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    model = _fit(_dense_model(), optimizer, _shard(x, size, rank),
                 _shard(y, size, rank), LOCAL_BATCH)
    assert model.optimizer is optimizer  # compile() did not wrap it again
    reference = _fit(_dense_model(), keras.optimizers.SGD(0.1, momentum=0.9),
                     x, y, size * LOCAL_BATCH)
    assert isinstance(reference.optimizer,
                      keras.optimizers.LossScaleOptimizer)
    # That batch comes once per epoch.
    applied = EPOCHS * (STEPS_PER_EPOCH - 1)
    assert int(optimizer.iterations) == applied
    assert int(reference.optimizer.iterations) == applied
    assert optimizer.dynamic_scale.numpy() == 2.0 ** (15 - EPOCHS)
    assert reference.optimizer.dynamic_scale.numpy() == 2.0 ** (15 - EPOCHS)
    _assert_same_weights(model, reference, tol=1e-3)
    # Bitwise the same weights on every rank.
    for w in model.get_weights():
        every = hvd_keras.allgather(w[np.newaxis])
        assert (every == every[:1]).all()


def test_mixed_precision_with_explicit_loss_scale_optimizer(size, rank):
    lso = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=256.0)
    optimizer = tfring.DistributedOptimizer(lso)
    assert isinstance(optimizer, tfring.keras.DistributedLossScaleOptimizer)
    assert optimizer.inner_optimizer is lso
    model = _dense_model(dtype="mixed_float16")
    reference = _dense_model(dtype="mixed_float16")
    x, y = _global_data(size)
    _fit(model, optimizer, _shard(x, size, rank), _shard(y, size, rank),
         LOCAL_BATCH)
    assert model.optimizer is optimizer
    _fit(reference, keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=256.0), x, y,
        size * LOCAL_BATCH)
    _assert_same_weights(model, reference, tol=1e-3)


def test_loss_scale_optimizer_around_distributed_optimizer_is_refused():
    optimizer = tfring.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match=r"(?s)test each rank's own.*"
                       r"DistributedOptimizer\(keras\.optimizers\."
                       r"LossScaleOptimizer\(opt\)\)"):
        keras.optimizers.LossScaleOptimizer(optimizer)


# --- arguments, attributes ------------------------------------------------

def test_argument_errors():
    sgd = keras.optimizers.SGD(0.1)
    with pytest.raises(TypeError, match="already a tfring"):
        tfring.DistributedOptimizer(tfring.DistributedOptimizer(sgd))
    with pytest.raises(TypeError, match="Expected a Keras 3 optimizer"):
        tfring.DistributedOptimizer(tf.Variable(1.0))
    with pytest.raises(ValueError, match="backward_passes_per_step=0"):
        tfring.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="Expected op=tfring.Average"):
        tfring.DistributedOptimizer(sgd, op=tfring.Sum,
                                    gradient_predivide_factor=2.0)


def test_state_is_the_inner_optimizers():
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer = hvd_keras.DistributedOptimizer(sgd)
    assert optimizer.learning_rate is sgd.learning_rate
    optimizer.learning_rate = 0.25
    assert float(sgd.learning_rate) == 0.25
    optimizer.momentum = 0.5  # as momentum-correcting callbacks do
    assert sgd.momentum == 0.5 and optimizer.momentum == 0.5
    assert optimizer.iterations is sgd.iterations


def test_keras_module_collectives(size, rank):
    total = hvd_keras.allreduce(np.array([rank, 1.0]), op=tfring.Sum,
                                name="keras_module_sum")
    assert isinstance(total, np.ndarray)
    np.testing.assert_allclose(total, [size * (size - 1) / 2, size])
    np.testing.assert_allclose(hvd_keras.allreduce(float(rank)),
                               (size - 1) / 2)
    gathered = hvd_keras.allgather([[rank]])
    np.testing.assert_array_equal(gathered, np.arange(size)[:, None])
    assert hvd_keras.broadcast(rank + 10, root_rank=0) == 10
    assert (hvd_keras.size(), hvd_keras.rank()) == (size, rank)


@pytest.mark.skipif(
    importlib.util.find_spec("tfring.keras.callbacks") is None,
    reason="tfring.keras.callbacks is not there yet")
def test_callbacks_load_on_first_use():
    assert hvd_keras.callbacks.__name__ == "tfring.keras.callbacks"
