# tfring.PowerSGD at any number of ranks: each rank holds its own share of a
# least-squares problem; training with rank-1 PowerSGD and error feedback
# gets as close to the optimum of the whole problem as plain averaging does,
# with identical weights on every rank. Before start_iter the reduction is
# exactly the plain average; the state (step, Q factors, errors) survives a
# tf.train.Checkpoint; the Keras DistributedOptimizer takes it in fit(); a
# step that fails between its two allreduces leaves the state as it was.

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfring
import tfring.keras as hvd_keras
from tfring import collectives

ROWS, FEATURES, OUTPUTS = 24, 10, 6


def _problem(rank):
    rng = np.random.default_rng(77 + rank)
    a = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    truth = np.random.default_rng(5).standard_normal((FEATURES, OUTPUTS))
    b = (a @ truth + 0.3 * rng.standard_normal((ROWS, OUTPUTS))).astype(np.float32)
    return a, b


def _optimum():
    """The least-squares solution of every rank's rows together."""
    parts = [_problem(r) for r in range(tfring.size())]
    a = np.concatenate([p[0] for p in parts]).astype(np.float64)
    b = np.concatenate([p[1] for p in parts]).astype(np.float64)
    w = np.linalg.lstsq(a, b, rcond=None)[0]
    return w, np.mean((a @ w - b) ** 2)


def _global_loss(w):
    parts = [_problem(r) for r in range(tfring.size())]
    return np.mean([np.mean((a @ w - b) ** 2) for a, b in parts])


def _train(compression, steps, traced):
    a, b = (tf.constant(x) for x in _problem(tfring.rank()))
    w = tf.Variable(tf.zeros((FEATURES, OUTPUTS)))
    opt = keras.optimizers.SGD(0.05)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(a @ w - b))
        tape = tfring.DistributedGradientTape(tape, compression=compression)
        opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))

    step = tf.function(step) if traced else step
    for _ in range(steps):
        step()
    return w.numpy()


def test_error_feedback_reaches_the_optimum():
    powersgd = tfring.PowerSGD(rank=1, start_iter=3)
    w = _train(powersgd, 400, traced=True)
    # As close to the optimum as uncompressed training gets in as many steps
    # (within 5%), from about 150 times the optimum at w = 0.
    plain = _global_loss(_train(tfring.Compression.none, 400, traced=True))
    _, best = _optimum()
    assert _global_loss(w) <= plain * 1.05, (_global_loss(w), plain, best)
    assert _global_loss(w) <= best * 2, (_global_loss(w), best)
    gathered = tfring.allgather(tf.constant(w[None])).numpy()
    for other in gathered:
        np.testing.assert_array_equal(other, w)
    assert int(powersgd.step.numpy()) == 400


def test_eager_steps_are_the_traced_ones():
    # Eagerly, PowerSGD takes the same steps as in a tf.function (which the
    # test above trains to the optimum), compressed ones included.
    eager = _train(tfring.PowerSGD(rank=1, start_iter=3), 12, traced=False)
    traced = _train(tfring.PowerSGD(rank=1, start_iter=3), 12, traced=True)
    np.testing.assert_allclose(eager, traced, rtol=1e-5, atol=1e-6)


def test_before_start_iter_it_is_the_plain_average():
    powersgd = tfring.PowerSGD(rank=1, start_iter=5)
    plain = _train(tfring.Compression.none, 3, traced=False)
    compressed = _train(powersgd, 3, traced=False)
    np.testing.assert_array_equal(compressed, plain)
    # Vectors and small matrices are never compressed.
    assert powersgd._matrix_shape(tf.zeros((7,))) is None
    assert powersgd._matrix_shape(tf.zeros((2, 2))) is None
    # A convolution kernel (h, w, in, out) is a (h * w * in) x out matrix.
    assert powersgd._matrix_shape(tf.zeros((3, 3, 8, 16))) == (72, 16, 1)


def test_state_survives_a_checkpoint(tmp_path):
    powersgd = tfring.PowerSGD(rank=1, start_iter=1)
    _train(powersgd, 4, traced=False)
    assert sorted(powersgd.factors) == ["g0"]
    path = tf.train.Checkpoint(powersgd=powersgd).write(
        str(tmp_path / f"rank{tfring.rank()}" / "ckpt"))
    restored = tfring.PowerSGD(rank=1, start_iter=1)
    tf.train.Checkpoint(powersgd=restored).read(path)
    # The Q factors and errors are made by the first step, then restored.
    w = tf.Variable(tf.zeros((FEATURES, OUTPUTS)))
    restored._state("g0", w, FEATURES, OUTPUTS, 1)
    assert int(restored.step.numpy()) == 4
    for key in powersgd.factors:
        np.testing.assert_array_equal(restored.factors[key].numpy(),
                                      powersgd.factors[key].numpy())
        np.testing.assert_array_equal(restored.errors[key].numpy(),
                                      powersgd.errors[key].numpy())
    assert np.any(powersgd.errors["g0"].numpy() != 0)


def test_keras_fit_with_powersgd():
    keras.utils.set_random_seed(3)
    a, b = _problem(tfring.rank())
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])
    powersgd = tfring.PowerSGD(rank=1, start_iter=2)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(0.05), compression=powersgd), loss="mse")
    model.fit(a, b, batch_size=ROWS, epochs=6, verbose=0, shuffle=False)
    assert int(powersgd.step.numpy()) == 6 and len(powersgd.factors) == 1
    kernel = model.get_weights()[0]
    gathered = tfring.allgather(tf.constant(kernel[None])).numpy()
    for other in gathered:
        np.testing.assert_array_equal(other, kernel)


def test_keras_model_save_keeps_powersgd_and_its_state(tmp_path):
    # A model saved mid-training and loaded again goes on exactly as the
    # original: the same PowerSGD arguments, step, Q factors and errors.
    keras.utils.set_random_seed(3)
    a, b = _problem(tfring.rank())
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])
    powersgd = tfring.PowerSGD(rank=1, start_iter=1, seed=4)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9), compression=powersgd), loss="mse")
    model.fit(a, b, batch_size=ROWS, epochs=3, verbose=0, shuffle=False)
    path = tmp_path / f"rank{tfring.rank()}" / "model.keras"
    path.parent.mkdir(parents=True)
    model.save(path)
    loaded = hvd_keras.load_model(path)
    restored = loaded.optimizer.compression
    assert isinstance(restored, tfring.PowerSGD) and restored is not powersgd
    assert restored.get_config() == powersgd.get_config()
    assert int(restored.step.numpy()) == 3
    for fitted in (model, loaded):
        fitted.fit(a, b, batch_size=ROWS, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_array_equal(restored.errors["g0"].numpy(),
                                  powersgd.errors["g0"].numpy())
    for mine, theirs in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    # An explicit compression= starts afresh.
    fresh = hvd_keras.load_model(path, compression=tfring.Compression.none)
    assert fresh.optimizer.compression is tfring.Compression.none
    # A state saved for another model is refused when its gradient appears.
    other = tfring.PowerSGD(rank=1)
    other.restore_saved_arrays({"powersgd.q.g0": np.zeros((3, 1), np.float32)})
    with pytest.raises(ValueError, match="cannot restore 'powersgd.q.g0'.*"
                       r"shape \(3, 1\).*needs \(6, 1\).*Expected the model"):
        other._state("g0", tf.zeros((FEATURES, OUTPUTS)), FEATURES, OUTPUTS, 1)


def test_a_single_tensor_is_refused():
    with pytest.raises(TypeError, match="compresses the gradients of a whole model"):
        tfring.allreduce(tf.ones((4, 4)), compression=tfring.PowerSGD())
    with pytest.raises(ValueError, match="Expected an integer of at least 1"):
        tfring.PowerSGD(rank=0)


def test_stacked_factors_are_orthogonalised_matrix_by_matrix():
    # The P factors of several matrices, stacked along their rows, come out
    # with orthonormal columns within each matrix, as Gram-Schmidt on each.
    from tfring.powersgd import _orthogonalize_stacked
    rows = [5, 9, 4]
    rng = np.random.default_rng(11)
    parts = [rng.standard_normal((n, 3)) for n in rows]
    stacked = _orthogonalize_stacked(
        tf.constant(np.concatenate(parts), tf.float64), rows, 0.0).numpy()
    for part, got in zip(parts, np.split(stacked, np.cumsum(rows)[:-1])):
        np.testing.assert_allclose(got.T @ got, np.eye(3), atol=1e-12)
        q, r = np.linalg.qr(part)
        np.testing.assert_allclose(got, q * np.sign(np.diag(r)), atol=1e-12)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_a_step_that_fails_between_its_allreduces_leaves_the_state(traced, monkeypatch):
    # An allreduce can fail mid-step (an elastic reset interrupts it); the
    # step is then run again. The failed step must leave the error, Q and
    # step as they were, or the step run again would add its gradient to
    # the error feedback twice. The failure is injected after the second
    # (Q) allreduce, the last one, at run time (also inside a tf.function).
    failing = tf.Variable(False)
    real_allreduce = collectives.grouped_allreduce

    def second_round_may_fail(tensors, name, **kwargs):
        reduced = real_allreduce(tensors, name=name, **kwargs)
        if not name.endswith(".q"):
            return reduced
        check = tf.debugging.Assert(tf.logical_not(failing), ["injected failure"])
        with tf.control_dependencies([check]):
            return [tf.identity(r) for r in reduced]

    monkeypatch.setattr(collectives, "grouped_allreduce", second_round_may_fail)
    rng = np.random.default_rng(30 + tfring.rank())
    steps = [[tf.constant(rng.standard_normal((FEATURES, OUTPUTS)), tf.float32)]
             for _ in range(3)]

    def stepper(powersgd):
        def step(grads):
            return powersgd.reduce_gradient_list(grads, ["g0"], {"op": tfring.Average})
        return tf.function(step) if traced else step

    retried, reference = (tfring.PowerSGD(rank=1, start_iter=0, name=f"p{i}")
                          for i in range(2))
    step_retried, step_reference = stepper(retried), stepper(reference)
    for grads in steps[:2]:
        step_retried(grads)
        step_reference(grads)
    before = retried.saved_arrays()
    assert np.any(before["powersgd.error.g0"] != 0)
    failing.assign(True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="injected failure"):
        step_retried(steps[2])
    for name, value in retried.saved_arrays().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    # Run again, the step gives what it gives without the failure.
    failing.assign(False)
    np.testing.assert_allclose(step_retried(steps[2])[0].numpy(),
                               step_reference(steps[2])[0].numpy(), rtol=1e-6)
    after, expected = retried.saved_arrays(), reference.saved_arrays()
    for name, value in expected.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-6, atol=1e-7,
                                   err_msg=name)
