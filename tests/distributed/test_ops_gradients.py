# The registered gradients of Tfring>Allreduce (every reduce op, with scale
# factors), Tfring>Allgather (different rows per rank, scalars) and
# Tfring>Broadcast (every root), through tf.GradientTape eagerly and inside
# tf.function, at any number of ranks; and those of the grouped calls over
# mixed dtypes, with incoming gradients of another dtype than the output.
#
# Rank r's loss is sum(w_r * y) with weights that depend on r, so the
# incoming gradient differs between ranks and the expected input gradient
# (a sum or average over ranks) is computed here in closed form.

import numpy as np
import pytest
import tensorflow as tf

import tfring
from tfring import ops

MODES = ["eager", "function"]


def _weights(shape, rank):
    """The incoming gradient of rank `rank`: (rank + 1) * (1, 2, 3, ...)."""
    count = int(np.prod(shape, dtype=np.int64))
    return (rank + 1.0) * (1.0 + np.arange(count)).reshape(shape)


def _sum_of_weights(shape, size):
    return sum(_weights(shape, r) for r in range(size))


def _offsets(shape, rank, size):
    count = int(np.prod(shape, dtype=np.int64))
    return ((np.arange(count) + rank) % size).reshape(shape).astype(np.float64)


def _gradient(forward, x, weights, mode):
    """d sum(weights * forward(x)) / dx, eagerly or in a tf.function."""
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
            loss = tf.reduce_sum(tf.cast(weights, y.dtype) * y)
        return tape.gradient(loss, x)

    if mode == "function":
        run = tf.function(run)
    return run(x).numpy()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,prescale,postscale", [
    ("Sum", 1.0, 1.0), ("Sum", 2.0, 3.0),
    ("Average", 1.0, 1.0), ("Average", 2.0, 3.0)])
def test_allreduce_sum_and_average(op, prescale, postscale, mode, rank, size):
    shape = (2, 3)
    x = tf.constant(_offsets(shape, rank, size))
    grad = _gradient(
        lambda t: ops.allreduce_op(t, getattr(tfring, op), prescale,
                                   postscale),
        x, _weights(shape, rank), mode)
    expected = _sum_of_weights(shape, size) * prescale * postscale
    if op == "Average":
        expected /= size
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,prescale,postscale", [
    ("Min", 1.0, 1.0), ("Max", 1.0, 1.0), ("Min", 2.0, 0.5),
    ("Max", -1.0, 3.0), ("Min", -2.0, 1.0)])
def test_allreduce_min_max(op, prescale, postscale, mode, rank, size):
    # Element i of rank r is 5 + (i + r) % size: exactly one rank holds each
    # element's minimum (offset 0) and one its maximum (offset size - 1).
    shape = (7,)
    offsets = _offsets(shape, rank, size)
    x = tf.constant(5.0 + offsets)
    grad = _gradient(
        lambda t: ops.allreduce_op(t, getattr(tfring, op), prescale,
                                   postscale),
        x, _weights(shape, rank), mode)
    # A negative prescale turns the minimum of prescale * x into the maximum.
    wants_min = (op == "Min") == (prescale > 0)
    holder_offset = 0 if wants_min else size - 1
    holds = (offsets == holder_offset).astype(np.float64)
    expected = _sum_of_weights(shape, size) * holds * prescale * postscale
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_min_ties_share_the_gradient(mode, size):
    shape = (3,)
    x = tf.constant([1.0, 2.0, 3.0])  # the same on every rank
    grad = _gradient(lambda t: ops.allreduce_op(t, tfring.Min), x,
                     _weights(shape, 0), mode)
    np.testing.assert_allclose(grad, _weights(shape, 0), rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prescale,postscale", [(1.0, 1.0), (2.0, 0.5)])
def test_allreduce_product(prescale, postscale, mode, rank, size):
    shape = (2, 2)
    inputs = [1.0 + _offsets(shape, r, size) for r in range(size)]
    x = tf.constant(inputs[rank])
    grad = _gradient(
        lambda t: ops.allreduce_op(t, tfring.Product, prescale, postscale),
        x, _weights(shape, rank), mode)
    others = np.prod([prescale * inputs[q] for q in range(size) if q != rank],
                     axis=0)
    expected = (_sum_of_weights(shape, size) * prescale * postscale *
                others)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_float32_and_named(mode, rank, size):
    x = tf.constant([1.0, float(rank)], tf.float32)
    grad = _gradient(
        lambda t: ops.allreduce_op(t, tfring.Average, name="named_grads"), x,
        _weights((2,), rank), mode)
    assert grad.dtype == np.float32
    np.testing.assert_allclose(grad, _sum_of_weights((2,), size) / size,
                               rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_allgather(mode, rank, size):
    # Rank r contributes r + 1 rows of 2 columns.
    rows = [r + 1 for r in range(size)]
    total = sum(rows)
    x = tf.fill([rows[rank], 2], float(rank))
    # Rank s weighs row j of the gathered tensor with (s + 1) * (j + 1).
    weights = (rank + 1.0) * np.repeat(np.arange(1.0, total + 1), 2).reshape(
        total, 2)
    grad = _gradient(ops.allgather_op, x, weights, mode)
    mean_factor = (size + 1) / 2.0  # mean over s of (s + 1)
    begin = sum(rows[:rank])
    expected = mean_factor * np.repeat(
        np.arange(begin + 1.0, begin + rows[rank] + 1), 2).reshape(-1, 2)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_rank_without_rows(mode, rank, size):
    x = tf.zeros([rank % 2, 3])
    weights = np.ones([sum(r % 2 for r in range(size)), 3])
    grad = _gradient(ops.allgather_op, x, weights, mode)
    assert grad.shape == (rank % 2, 3)
    np.testing.assert_allclose(grad, np.ones([rank % 2, 3]))


@pytest.mark.parametrize("mode", MODES)
def test_allgather_scalar(mode, rank, size):
    x = tf.constant(float(rank))
    weights = (rank + 1.0) * np.arange(1.0, size + 1)
    grad = _gradient(ops.allgather_op, x, weights, mode)
    assert grad.shape == ()
    np.testing.assert_allclose(grad, (size + 1) / 2.0 * (rank + 1), rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_every_root(mode, rank, size):
    shape = (3,)
    x = tf.constant(np.full(shape, float(rank)))
    for root_rank in range(size):
        grad = _gradient(lambda t: ops.broadcast_op(t, root_rank), x,
                         _weights(shape, rank), mode)
        # Horovod's definition: the average of every rank's incoming
        # gradient on the root, zero elsewhere.
        expected = (_sum_of_weights(shape, size) / size if rank == root_rank
                    else np.zeros(shape))
        np.testing.assert_allclose(grad, expected, rtol=1e-12,
                                   err_msg=f"root {root_rank}")


def test_gradient_through_a_variable_and_two_collectives(rank, size):
    v = tf.Variable([1.0 + rank, 2.0])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            averaged = ops.allreduce_op(v, tfring.Average)
            shared = ops.broadcast_op(averaged * averaged, 0)
            loss = tf.reduce_sum(shared)
        return tape.gradient(loss, v)

    mean = np.mean([[1.0 + r, 2.0] for r in range(size)], axis=0)
    # Every rank's loss is the root's sum(mean^2): the broadcast gradient is
    # the average of the ranks' ones (ones) times 2 * mean on the root and 0
    # elsewhere; the Average gradient averages that over the ranks.
    expected = 2.0 * mean / size
    np.testing.assert_allclose(step().numpy(), expected, rtol=1e-6)


# --- grouped calls: mixed dtypes, incoming gradients of another dtype ----
#
# Horovod's tests pass float32 incoming gradients for float64 outputs, which
# its grouped ops' registered gradients accept. Eagerly, tfring runs a
# grouped call as one tf.function, whose traced backward function took only
# the outputs' dtypes ("expected to be a double tensor but is a float
# tensor").

GROUPED_DTYPES = [tf.float32, tf.float64]


def _grouped_gradients(call, xs, incoming, mode, one_at_a_time=False):
    """d(outputs . incoming) / dxs for outputs = call(xs), eagerly or in a
    tf.function; with `one_at_a_time`, one tape.gradient per output (of a
    persistent tape), as Horovod's tests do."""
    def run(xs, incoming):
        with tf.GradientTape(persistent=one_at_a_time) as tape:
            tape.watch(xs)
            outputs = call(xs)
        if one_at_a_time:
            return [tape.gradient(y, x, output_gradients=g)
                    for y, x, g in zip(outputs, xs, incoming)]
        return tape.gradient(outputs, xs, output_gradients=incoming)

    if mode == "function":
        run = tf.function(run)
    return [g.numpy() for g in run(xs, incoming)]


def _row_weights(rows, columns, rank, dtype):
    """Rank `rank`'s incoming gradient: row j is (rank + 1) * (j + 1)."""
    column = (rank + 1.0) * np.arange(1.0, rows + 1)
    return tf.constant(np.repeat(column, columns).reshape(rows, columns),
                       dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("incoming_dtype", [None, tf.float32],
                         ids=["output_dtype", "float32"])
@pytest.mark.parametrize("one_at_a_time", [False, True],
                         ids=["together", "one_at_a_time"])
def test_grouped_allgather_mixed_dtypes(mode, incoming_dtype, one_at_a_time,
                                        rank, size):
    # Rank r contributes r + 1 rows; member i has i + 2 columns.
    rows = [r + 1 for r in range(size)]
    total, begin = sum(rows), sum(rows[:rank])
    xs = [tf.fill([rows[rank], i + 2], tf.cast(rank, dtype))
          for i, dtype in enumerate(GROUPED_DTYPES)]
    incoming = [_row_weights(total, i + 2, rank, incoming_dtype or dtype)
                for i, dtype in enumerate(GROUPED_DTYPES)]
    grads = _grouped_gradients(tfring.grouped_allgather, xs, incoming, mode,
                               one_at_a_time)
    # Horovod's definition: this rank's rows of the average of the ranks'
    # incoming gradients; the mean over s of (s + 1) is (size + 1) / 2.
    for i, grad in enumerate(grads):
        column = (size + 1) / 2.0 * np.arange(begin + 1.0,
                                              begin + rows[rank] + 1)
        expected = np.repeat(column, i + 2).reshape(rows[rank], i + 2)
        np.testing.assert_array_equal(grad, expected, err_msg=f"member {i}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["Sum", "Average"])
@pytest.mark.parametrize("incoming_dtype", [None, tf.float32],
                         ids=["output_dtype", "float32"])
@pytest.mark.parametrize("one_at_a_time", [False, True],
                         ids=["together", "one_at_a_time"])
def test_grouped_reducescatter_mixed_dtypes(mode, op, incoming_dtype,
                                            one_at_a_time, rank, size):
    # Two rows per rank; member i has i + 2 columns.
    xs = [tf.fill([2 * size, i + 2], tf.cast(rank, dtype))
          for i, dtype in enumerate(GROUPED_DTYPES)]
    incoming = [_row_weights(2, i + 2, rank, incoming_dtype or dtype)
                for i, dtype in enumerate(GROUPED_DTYPES)]
    grads = _grouped_gradients(
        lambda ts: tfring.grouped_reducescatter(ts, op=getattr(tfring, op)),
        xs, incoming, mode, one_at_a_time)
    # Horovod's definition: the allgather of the incoming gradients, times
    # the number of ranks for Sum.
    factor = size if op == "Sum" else 1
    for i, grad in enumerate(grads):
        expected = factor * np.concatenate(
            [_row_weights(2, i + 2, s, tf.float64).numpy()
             for s in range(size)])
        np.testing.assert_array_equal(grad, expected, err_msg=f"member {i}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_grouped_allreduce_float32_incoming_gradients(mode, op, rank, size):
    xs = [tf.fill([2, i + 2], tf.cast(rank, dtype))
          for i, dtype in enumerate(GROUPED_DTYPES)]
    incoming = [_row_weights(2, i + 2, rank, tf.float32)
                for i in range(len(xs))]
    grads = _grouped_gradients(
        lambda ts: tfring.grouped_allreduce(ts, op=getattr(tfring, op)),
        xs, incoming, mode)
    for i, grad in enumerate(grads):
        expected = sum(_row_weights(2, i + 2, s, tf.float64).numpy()
                       for s in range(size))
        if op == "Average":
            expected = expected / size
        np.testing.assert_allclose(grad, expected, rtol=1e-6,
                                   err_msg=f"member {i}")
