# The Tfring>Allgather op through tfring.ops.allgather_op, at any number of
# ranks: every dtype x 0-3 dimensions, a first dimension that differs between
# ranks (including ranks contributing no rows), scalars, zero-element shapes,
# eagerly and in tf.function, and the static shape the op infers.

import numpy as np
import pytest
import tensorflow as tf

from tfring import ops
from dtype_values import to_float64, to_tensor

GATHER_DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64,
                 tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.bool]
# Trailing dimensions; the first dimension is chosen per rank.
TRAILING_SHAPES = [(), (3,), (2, 2), (0,)]


def _rows(rank):
    """Rank r contributes r rows: rank 0 none, rank 1 one, ..."""
    return rank


def _rank_values(rows, trailing, rank):
    """float64 values exact in every dtype, different on every rank."""
    count = rows * int(np.prod(trailing, dtype=np.int64))
    values = (np.arange(count) % 7 + 10 * rank) % 50
    return values.reshape((rows,) + tuple(trailing)).astype(np.float64)


def _expected(trailing, dtype, size):
    parts = [_rank_values(_rows(r), trailing, r) for r in range(size)]
    gathered = np.concatenate(parts, axis=0)
    return gathered % 2 if dtype == tf.bool else gathered


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", GATHER_DTYPES, ids=lambda d: d.name)
def test_allgather_every_dtype_and_rank(dtype, mode, rank, size):
    inputs = [to_tensor(_rank_values(_rows(rank), trailing, rank), dtype)
              for trailing in TRAILING_SHAPES]

    def run(tensors):
        return [ops.allgather_op(t) for t in tensors]

    results = run(inputs) if mode == "eager" else tf.function(run)(inputs)
    for trailing, result in zip(TRAILING_SHAPES, results):
        what = f"{dtype.name} rows {_rows(rank)} x {list(trailing)} ({mode})"
        assert result.dtype == dtype, what
        expected = _expected(trailing, dtype, size)
        assert result.shape == expected.shape, what
        np.testing.assert_array_equal(to_float64(result), expected,
                                      err_msg=what)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_same_first_dimension_everywhere(mode, rank, size):
    x = tf.fill([2, 3], rank)

    def run():
        return ops.allgather_op(x)

    result = run() if mode == "eager" else tf.function(run)()
    expected = np.repeat(np.arange(size), 2)[:, None] * np.ones((1, 3))
    np.testing.assert_array_equal(result.numpy(), expected)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.float32, tf.bool],
                         ids=lambda d: d.name)
def test_scalars_gather_to_one_element_per_rank(dtype, mode, rank, size):
    x = to_tensor(np.array(float(rank + 1)), dtype)

    def run():
        return ops.allgather_op(x)

    result = run() if mode == "eager" else tf.function(run)()
    expected = np.arange(1, size + 1, dtype=np.float64)
    if dtype == tf.bool:
        expected = expected % 2
    assert result.shape == (size,)
    np.testing.assert_array_equal(to_float64(result), expected)


def test_every_rank_contributes_no_rows(size):
    result = ops.allgather_op(tf.zeros([0, 4], tf.float32))
    assert result.shape == (0, 4)


def test_zero_size_trailing_dimension(rank, size):
    result = ops.allgather_op(tf.zeros([rank + 1, 0, 2], tf.int64))
    assert result.shape == (size * (size + 1) // 2, 0, 2)


def test_inferred_static_shape():
    @tf.function
    def run(matrix, scalar):
        gathered = ops.allgather_op(matrix)
        gathered_scalars = ops.allgather_op(scalar)
        # Only the first dimension depends on the other ranks.
        assert gathered.shape.as_list() == [None, 3]
        assert gathered_scalars.shape.as_list() == [None]
        return gathered, gathered_scalars

    run(tf.zeros([2, 3]), tf.constant(1.0))

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def unknown_rank(x):
        assert ops.allgather_op(x).shape.rank is None
        return ops.allgather_op(x)

    unknown_rank.get_concrete_function()


@pytest.mark.requires_ranks(2)
def test_trailing_shape_mismatch_names_the_ranks(rank):
    x = tf.zeros([1, 2 + rank % 2])
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="shape after the first dimension"):
        ops.allgather_op(x, name="mismatched_trailing")
    # The next collective still works.
    assert ops.allgather_op(tf.zeros([1, 2])).shape[1] == 2


@pytest.mark.requires_ranks(2)
def test_scalar_and_vector_do_not_mix(rank):
    x = tf.constant(1.0) if rank == 0 else tf.constant([1.0])
    with pytest.raises(tf.errors.FailedPreconditionError, match="scalar"):
        ops.allgather_op(x, name="scalar_or_vector")
