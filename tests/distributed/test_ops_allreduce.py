# The Tfring>Allreduce op through its thin wrapper tfring.ops.allreduce_op, at
# any number of ranks: every reduce op x every dtype x 0-3 dimensions and
# zero-element shapes, eagerly and in tf.function, with scale factors.
#
# Inputs are small integers derived from the rank, so every expected result is
# exact in every dtype (including float16 and bfloat16) and is compared
# exactly. Element i of rank r holds base[i] + (i + r) % size, so the rank
# holding the minimum (or maximum) differs from element to element.

import numpy as np
import pytest
import tensorflow as tf

from tfring import _core
from tfring import ops

REDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16,
                 tf.bfloat16, tf.float32, tf.float64]
SHAPES = [(), (5,), (3, 4), (2, 3, 2), (0,), (2, 0, 3)]
REDUCE_OPS = ["Sum", "Average", "Min", "Max", "Product"]


def _offsets(shape, rank, size):
    """(i + rank) % size at flat index i: the extremum's holder varies."""
    count = int(np.prod(shape, dtype=np.int64))
    return ((np.arange(count) + rank) % size).reshape(shape)


def _rank_input(shape, dtype, op, rank, size):
    """Rank `rank`'s input for `op`, as float64 values exact in `dtype`."""
    count = int(np.prod(shape, dtype=np.int64))
    base = (np.arange(count) % 4).reshape(shape).astype(np.float64)
    if dtype.is_integer and not dtype.is_unsigned:
        base -= 2  # negative values too
    offsets = _offsets(shape, rank, size)
    if op == "Product":
        return 1.0 + offsets  # product of 1..size: small
    if op == "Average":
        return base + 2 * offsets  # the sum is divisible by size
    return base + offsets


def _expected(shape, dtype, op, size):
    stack = np.stack([_rank_input(shape, dtype, op, r, size)
                      for r in range(size)])
    if op == "Average":
        # The core multiplies the sum by 1/size in double precision; integer
        # results are then rounded toward zero. The sum is divisible by size,
        # so this differs from the exact mean by at most one rounding step.
        averaged = np.sum(stack, axis=0) * (1.0 / size)
        return np.trunc(averaged) if dtype.is_integer else averaged
    reduce = {"Sum": np.sum, "Min": np.min, "Max": np.max,
              "Product": np.prod}[op]
    return reduce(stack, axis=0)


def _check(result, expected, dtype, what, rtol=0.0):
    assert result.dtype == dtype, what
    got = tf.cast(result, tf.float64).numpy()
    assert got.shape == expected.shape, what
    if rtol:
        np.testing.assert_allclose(got, expected, rtol=rtol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=lambda d: d.name)
def test_allreduce_every_op_dtype_and_shape(dtype, op, mode, rank, size):
    reduce_op = getattr(_core.ReduceOp, op)
    inputs = [tf.cast(_rank_input(shape, dtype, op, rank, size), dtype)
              for shape in SHAPES]

    def run(tensors):
        return [ops.allreduce_op(t, reduce_op) for t in tensors]

    results = run(inputs) if mode == "eager" else tf.function(run)(inputs)
    # Only a float Average involves inexact arithmetic (the 1/size factor).
    rtol = 1e-2 if op == "Average" and dtype.is_floating else 0.0
    for shape, result in zip(SHAPES, results):
        _check(result, _expected(shape, dtype, op, size), dtype,
               f"{op} of {dtype.name}{list(shape)} ({mode})", rtol)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_reduce_op_as_int_or_enum(mode, rank, size):
    x = tf.constant([rank + 1.0])

    def run():
        return (ops.allreduce_op(x, 1),
                ops.allreduce_op(x, _core.ReduceOp.Sum),
                ops.allreduce_op(x, int(_core.ReduceOp.Max)))

    by_int, by_enum, by_max = run() if mode == "eager" else tf.function(run)()
    total = size * (size + 1) / 2
    assert by_int.numpy().tolist() == [total]
    assert by_enum.numpy().tolist() == [total]
    assert by_max.numpy().tolist() == [float(size)]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32,
                                   tf.float64], ids=lambda d: d.name)
def test_scale_factors_floats(dtype, mode, rank, size):
    x = tf.cast(tf.constant([[rank + 1.0, -2.0], [0.5, 4.0]]), dtype)
    total = np.array([[size * (size + 1) / 2, -2.0 * size],
                      [0.5 * size, 4.0 * size]])

    def run():
        return (ops.allreduce_op(x, _core.ReduceOp.Sum, prescale_factor=2.0,
                                 postscale_factor=0.25),
                ops.allreduce_op(x, _core.ReduceOp.Average,
                                 prescale_factor=4.0),
                ops.allreduce_op(x, _core.ReduceOp.Sum, postscale_factor=8.0))

    summed, averaged, post = run() if mode == "eager" else tf.function(run)()
    _check(summed, total * 0.5, dtype, "Sum, pre 2, post 0.25")
    # Average divides by size, which is inexact at size 3: allow rounding.
    np.testing.assert_allclose(tf.cast(averaged, tf.float64).numpy(),
                               total * 4.0 / size, rtol=1e-2)
    _check(post, total * 8.0, dtype, "Sum, post 8")


def test_scale_factors_integers(rank, size):
    x = tf.constant([rank + 3, -7], tf.int32)
    result = ops.allreduce_op(x, _core.ReduceOp.Sum, prescale_factor=2.0,
                              postscale_factor=3.0)
    expected = [6 * (3 * size + size * (size - 1) // 2), -42 * size]
    assert result.numpy().tolist() == expected


def test_static_shape_is_the_input_shape():
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def run(x):
        y = ops.allreduce_op(x, _core.ReduceOp.Sum)
        assert y.shape.as_list() == [None, 3]
        return y

    assert run(tf.ones([2, 3])).shape == (2, 3)


def test_variable_input_is_left_unchanged(rank, size):
    # The kernel may reduce in place into a forwarded input buffer; a
    # variable's buffer is never forwarded.
    v = tf.Variable([rank + 1.0, 1.0])
    result = ops.allreduce_op(v, _core.ReduceOp.Sum)
    assert result.numpy().tolist() == [size * (size + 1) / 2, float(size)]
    assert v.numpy().tolist() == [rank + 1.0, 1.0]


def test_many_tensors_in_one_function(rank, size):
    # Stateless ops: the executor may start them in any order on each rank;
    # the core matches them by name.
    tensors = [tf.fill([k % 5 + 1], float(rank + k)) for k in range(40)]

    @tf.function
    def run():
        return [ops.allreduce_op(t, _core.ReduceOp.Sum) for t in tensors]

    for k, result in enumerate(run()):
        expected = size * k + size * (size - 1) / 2
        assert result.numpy().tolist() == [expected] * (k % 5 + 1), k


def test_unsupported_reduce_op_is_rejected():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"reduce_op 2 is not supported.*tfring\.Sum"):
        ops.allreduce_op(tf.constant([1.0]), int(_core.ReduceOp.Adasum))


def test_unsupported_dtype_is_rejected_by_the_op_definition():
    # bool and 16-bit integers can be gathered and broadcast, not reduced.
    for dtype in (tf.bool, tf.uint16, tf.int16):
        x = tf.zeros([2], dtype)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="not in the list of allowed values"):
            ops.allreduce_op(x, _core.ReduceOp.Sum)
        with pytest.raises(TypeError, match="allowed values"):
            tf.function(lambda: ops.allreduce_op(x, _core.ReduceOp.Sum))()
