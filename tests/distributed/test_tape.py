# DistributedGradientTape at any number of ranks: the gradients equal the
# average (or other reduction) of every rank's local gradients, eagerly and
# in tf.function, with None and IndexedSlices gradients, predivision, groups
# and the attributes forwarded to the wrapped tape.

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfring


def _data(rank):
    rng = np.random.default_rng(500 + rank)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def _variables():
    w = tf.Variable([[0.5], [-1.0], [2.0]], name="w")
    b = tf.Variable([0.1], name="b")
    unused = tf.Variable([3.0], name="unused")
    return w, b, unused


def _loss(w, b, x, y):
    return tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)


def _local_grads(r):
    """Rank r's gradients for (w, b), computed here for any r."""
    w, b, _ = _variables()
    x, y = _data(r)
    with tf.GradientTape() as tape:
        loss = _loss(w, b, x, y)
    return [g.numpy() for g in tape.gradient(loss, [w, b])]


def _expected(size, reduce=np.mean):
    per_rank = [_local_grads(r) for r in range(size)]
    return [reduce(np.stack([g[i] for g in per_rank]), axis=0)
            for i in range(2)]


def _distributed_grads(rank, mode, **kwargs):
    w, b, unused = _variables()
    x, y = _data(rank)

    def step():
        with tf.GradientTape() as tape:
            loss = _loss(w, b, x, y)
        tape = tfring.DistributedGradientTape(tape, **kwargs)
        return tape.gradient(loss, [w, b, unused])

    return step() if mode == "eager" else tf.function(step)()


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_gradients_are_the_average_of_every_rank(mode, size, rank):
    grads = _distributed_grads(rank, mode)
    assert grads[2] is None  # unconnected stays None
    for got, want in zip(grads[:2], _expected(size)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [
    dict(gradient_predivide_factor=2.0),
    dict(groups=2),
    dict(groups=1),
    dict(compression=tfring.Compression.fp16),
    dict(sparse_as_dense=True),
])
def test_options_keep_the_average(kwargs, size, rank):
    grads = _distributed_grads(rank, "eager", **kwargs)
    tol = 1e-2 if "compression" in kwargs else 1e-5
    for got, want in zip(grads[:2], _expected(size)):
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)


def test_groups_of_variables(size, rank):
    w, b, unused = _variables()
    x, y = _data(rank)
    with tf.GradientTape() as tape:
        loss = _loss(w, b, x, y)
    tape = tfring.DistributedGradientTape(tape, groups=[[b], [unused]])
    grads = tape.gradient(loss, [w, b, unused])  # w is in no group
    assert grads[2] is None
    for got, want in zip(grads[:2], _expected(size)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, reduce", [("Sum", np.sum), ("Max", np.max)])
def test_other_ops(op, reduce, size, rank):
    grads = _distributed_grads(rank, "function", op=getattr(tfring, op))
    for got, want in zip(grads[:2], _expected(size, reduce)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_wrapper_used_as_context_manager_and_forwarding(size, rank):
    x = tf.constant([float(rank + 1)])
    with tfring.DistributedGradientTape(
            tf.GradientTape(persistent=True)) as tape:
        tape.watch(x)  # forwarded to the wrapped tape
        y = x * x
        with tape.stop_recording():
            _ = x * 3.0
    assert isinstance(tape, tfring.DistributedGradientTape)
    expected = [2.0 * sum(r + 1 for r in range(size)) / size]
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), expected)
    # Persistent: a second call works; nested sources keep their structure.
    nested = tape.gradient(y, {"a": x, "b": [x]})
    np.testing.assert_allclose(nested["a"].numpy(), expected)
    np.testing.assert_allclose(nested["b"][0].numpy(), expected)
    np.testing.assert_allclose(
        tape.gradient(y, x, unconnected_gradients="zero").numpy(), expected)
    assert tape.watched_variables() == ()
    del tape


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_embedding_gradients(sparse_as_dense, size, rank):
    table = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [6, 2]))
    ids = tf.constant([rank % 6, 5])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids)) * (rank + 1)
        tape = tfring.DistributedGradientTape(
            tape, sparse_as_dense=sparse_as_dense)
        return tape.gradient(loss, table)

    for grad in (step(), tf.function(step)()):
        assert isinstance(grad, tf.IndexedSlices) != sparse_as_dense
        expected = np.zeros([6, 2], np.float32)
        for r in range(size):
            expected[r % 6] += (r + 1) / size
            expected[5] += (r + 1) / size
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   expected, rtol=1e-6)


def test_keras_training_keeps_ranks_in_step(size, rank):
    keras.utils.set_random_seed(7 + rank)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    tfring.broadcast_variables(model.variables, root_rank=0)
    x, y = _data(rank)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        tape = tfring.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(3):
        train_step()
    for v in model.trainable_variables:
        gathered = tfring.allgather_object(v.numpy())
        for g in gathered:
            np.testing.assert_allclose(g, gathered[0], rtol=1e-6)


def test_registered_gradients(size, rank):
    x = tf.constant([1.0, 2.0]) * (rank + 1)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        summed = tfring.allreduce(x, op=tfring.Sum)
        gathered = tfring.allgather(x)
        root = tfring.broadcast(x, 0)
    # d/dx of sum(allreduce_sum(x)) over all ranks' losses: size.
    np.testing.assert_allclose(tape.gradient(summed, x).numpy(), [size] * 2)
    # allgather: average of the gathered gradient, this rank's slice.
    np.testing.assert_allclose(tape.gradient(gathered, x).numpy(), [1.0] * 2)
    # broadcast: the average of the incoming gradients on the root (Horovod's
    # definition), zero elsewhere.
    expected = [1.0] * 2 if rank == 0 else [0.0] * 2
    np.testing.assert_allclose(tape.gradient(root, x).numpy(), expected)


def test_bad_arguments():
    tape = tf.GradientTape()
    with pytest.raises(ValueError, match="Expected op=tfring.Average"):
        tfring.DistributedGradientTape(tape, op=tfring.Sum,
                                       gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups="):
        tfring.DistributedGradientTape(tape, groups=-1)
    with pytest.raises(TypeError, match="already a DistributedGradientTape"):
        tfring.DistributedGradientTape(tfring.DistributedGradientTape(tape))
    with pytest.raises(NotImplementedError, match="Adasum"):
        tfring.DistributedGradientTape(tape, op=tfring.Adasum)
    with pytest.warns(DeprecationWarning):
        tfring.DistributedGradientTape(tape, num_groups=2)


def test_eager_wrapper_per_step_does_not_retrace(size, rank):
    # Scripts wrap a new tape on every step; the reduction function must be
    # traced once, not once per step.
    w, b, _ = _variables()
    x, y = _data(rank)
    tapes = []
    traced = []
    for _ in range(4):
        with tf.GradientTape() as tape:
            loss = _loss(w, b, x, y)
        tape = tfring.DistributedGradientTape(tape, op=tfring.Sum)
        tape.gradient(loss, [w, b])
        tapes.append(tape)
        traced.append(tape._eager_reduce.experimental_get_tracing_count())
    fn = tapes[0]._eager_reduce
    assert all(t._eager_reduce is fn for t in tapes)
    # The function is shared by every tape of the process (earlier tests may
    # have traced it for other shapes): steps after the first trace nothing.
    assert traced[0] >= 1 and traced[1:] == [traced[0]] * 3, traced
