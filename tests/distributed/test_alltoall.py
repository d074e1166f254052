# tfring.alltoall at any number of ranks: every dtype x 0-2 trailing
# dimensions (including zero-size ones), explicit splits that send zero rows
# to some ranks, a rank that sends nothing at all and one that receives
# nothing, splits given as a list, a numpy array or an int32/int64 tensor,
# splits=None (even split), the received splits it returns, its gradient (the
# reverse alltoall), bad splits on every rank and on one rank only (every
# rank gets the error and the job goes on), scalars, XLA, a tf.compat.v1
# session and the low-level tfring.ops.alltoall_op; eagerly and in
# tf.function.
#
# Why: alltoall is the only collective whose output on a rank depends on
# what every other rank chose to send it, so the expected output of rank j
# is rebuilt here in NumPy from every rank's (deterministic) input and splits.
# Values are small integers, exact in every dtype, and compared exactly.

import numpy as np
import pytest
import tensorflow as tf

import tfring
from tfring import ops
from dtype_values import to_float64, to_tensor

ALLTOALL_DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32,
                   tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64,
                   tf.bool]
# Dimensions after the first; (0,) and (2, 0) make zero-size tensors.
TRAILING_SHAPES = [(), (3,), (2, 2), (0,), (2, 0)]
MODES = ["eager", "function"]


def _run(fn, mode, *args):
    """fn(*args) eagerly or as a tf.function."""
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


# Split patterns: pattern(r, n) is what rank r of n sends to each rank.
def _mixed(r, n):
    """0, 1 or 2 rows per destination: each rank skips some (n >= 2)."""
    return [(r + 2 * j + 1) % 3 for j in range(n)]


def _rank0_sends_nothing(r, n):
    return [0 if r == 0 else j + 1 for j in range(n)]


def _last_receives_nothing(r, n):
    return [0 if j == n - 1 else r + j + 1 for j in range(n)]


def _nothing_anywhere(r, n):
    return [0] * n


def _one_row_each(r, n):
    return [1] * n


def _two_rows_each(r, n):
    """What splits=None does with 2 * n rows."""
    return [2] * n


SPLIT_PATTERNS = {
    "mixed": _mixed,
    "rank0_sends_nothing": _rank0_sends_nothing,
    "last_receives_nothing": _last_receives_nothing,
    "nothing_anywhere": _nothing_anywhere,
    "one_row_each": _one_row_each,
}


def _values(rank, rows, trailing):
    """Rank `rank`'s input as float64 integers in [0, 101): exact in every
    dtype, different on every rank and row (bool: odd is True)."""
    shape = (rows,) + tuple(trailing)
    count = int(np.prod(shape, dtype=np.int64))
    flat = (37 * rank + 3 * np.arange(count) + 1) % 101
    return flat.reshape(shape).astype(np.float64)


def _input(rank, size, pattern, trailing, dtype=tf.float32):
    return to_tensor(_values(rank, sum(pattern(rank, size)), trailing), dtype)


def _expected(rank, size, pattern, trailing, dtype=tf.float32):
    """Rank `rank`'s output: the rows each rank i sent it, in rank order."""
    parts = []
    for i in range(size):
        splits = pattern(i, size)
        sent = _values(i, sum(splits), trailing)
        start = sum(splits[:rank])
        parts.append(sent[start:start + splits[rank]])
    result = np.concatenate(parts, axis=0)
    return result % 2 if dtype == tf.bool else result


def _expected_received_splits(rank, size, pattern):
    return np.array([pattern(i, size)[rank] for i in range(size)], np.int32)


def _check(result, received, rank, size, pattern, trailing, dtype, what):
    expected = _expected(rank, size, pattern, trailing, dtype)
    assert result.dtype == dtype, f"{what}: output dtype {result.dtype}"
    assert tuple(result.shape) == expected.shape, (
        f"{what}: output shape {result.shape}, expected {expected.shape}")
    np.testing.assert_array_equal(to_float64(result), expected,
                                  err_msg=f"{what}: output values")
    assert received.dtype == tf.int32, (
        f"{what}: received_splits dtype {received.dtype}, expected int32")
    np.testing.assert_array_equal(
        received.numpy(), _expected_received_splits(rank, size, pattern),
        err_msg=f"{what}: received_splits")


def _still_works(rank, size):
    """A correct alltoall after an error: the job goes on."""
    x = _input(rank, size, _mixed, (2,))
    result, received = tfring.alltoall(x, splits=_mixed(rank, size))
    _check(result, received, rank, size, _mixed, (2,), tf.float32,
           "alltoall after an error")


@pytest.mark.parametrize("mode", MODES)
def test_every_dtype_and_trailing_shape(mode, rank, size):
    cases = [(d, t) for d in ALLTOALL_DTYPES for t in TRAILING_SHAPES]
    inputs = [_input(rank, size, _mixed, t, d) for d, t in cases]
    splits = _mixed(rank, size)

    def run(tensors):
        return [tfring.alltoall(x, splits=splits) for x in tensors]

    results = _run(run, mode, inputs)
    assert len(results) == len(cases), "one result per alltoall"
    for (dtype, trailing), (result, received) in zip(cases, results):
        _check(result, received, rank, size, _mixed, trailing, dtype,
               f"{dtype.name} x {list(trailing)} splits {splits} ({mode})")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern_name", sorted(SPLIT_PATTERNS))
def test_split_patterns(pattern_name, mode, rank, size):
    # Zero rows to some ranks, a rank sending nothing, a rank receiving
    # nothing, nothing at all: the output may have no rows.
    pattern = SPLIT_PATTERNS[pattern_name]
    cases = [(tf.float32, (3,)), (tf.int64, ()), (tf.bool, (1, 2))]
    inputs = [_input(rank, size, pattern, t, d) for d, t in cases]
    splits = pattern(rank, size)

    def run(tensors):
        return [tfring.alltoall(x, splits=splits) for x in tensors]

    for (dtype, trailing), (result, received) in zip(cases,
                                                     _run(run, mode, inputs)):
        _check(result, received, rank, size, pattern, trailing, dtype,
               f"{pattern_name} {dtype.name} x {list(trailing)} ({mode})")


SPLITS_KINDS = {
    "list": lambda s: list(s),
    "numpy_int32": lambda s: np.array(s, np.int32),
    "numpy_int64": lambda s: np.array(s, np.int64),
    "tensor_int32": lambda s: tf.constant(s, tf.int32),
    "tensor_int64": lambda s: tf.constant(s, tf.int64),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(SPLITS_KINDS))
def test_splits_argument_types(kind, mode, rank, size):
    splits = SPLITS_KINDS[kind](_mixed(rank, size))
    x = _input(rank, size, _mixed, (2,))
    what = f"splits as {kind} ({mode})"
    if mode == "function" and kind.startswith("tensor"):
        # A tensor argument: its values are only known when the step runs.
        result, received = tf.function(
            lambda t, s: tfring.alltoall(t, splits=s))(x, splits)
    else:
        result, received = _run(lambda: tfring.alltoall(x, splits=splits),
                                mode)
    _check(result, received, rank, size, _mixed, (2,), tf.float32, what)


@pytest.mark.parametrize("mode", MODES)
def test_even_split_without_splits(mode, rank, size):
    # splits=None: dimension 0 split into `size` equal blocks, and only the
    # tensor comes back. 0 rows is divisible too.
    cases = [(tf.float32, (2,), _two_rows_each), (tf.int32, (), _one_row_each),
             (tf.uint8, (3,), _nothing_anywhere)]
    inputs = [_input(rank, size, pattern, t, d) for d, t, pattern in cases]

    def run(tensors):
        return [tfring.alltoall(x) for x in tensors]

    for (dtype, trailing, pattern), result in zip(cases,
                                                  _run(run, mode, inputs)):
        what = (f"splits=None, {sum(pattern(rank, size))} rows of "
                f"{dtype.name} x {list(trailing)} ({mode})")
        assert isinstance(result, tf.Tensor), (
            f"{what}: returns a tensor, not {type(result).__name__}")
        expected = _expected(rank, size, pattern, trailing, dtype)
        assert result.dtype == dtype, what
        assert tuple(result.shape) == expected.shape, (
            f"{what}: shape {result.shape}, expected {expected.shape}")
        np.testing.assert_array_equal(to_float64(result), expected,
                                      err_msg=what)


def _weights(rank, rows, trailing):
    """Rank `rank`'s incoming gradient: (rank + 1) * (1, 2, 3, ...)."""
    shape = (rows,) + tuple(trailing)
    count = int(np.prod(shape, dtype=np.int64))
    return (rank + 1.0) * (1.0 + np.arange(count)).reshape(shape)


def _expected_gradient(rank, size, pattern, trailing):
    """Rows rank `rank` sent to j get back the rows of j's weights that they
    landed on."""
    parts = []
    splits = pattern(rank, size)
    for j in range(size):
        received_by_j = [pattern(i, size)[j] for i in range(size)]
        w = _weights(j, sum(received_by_j), trailing)
        start = sum(received_by_j[:rank])
        parts.append(w[start:start + splits[j]])
    return np.concatenate(parts, axis=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern_name",
                         ["mixed", "rank0_sends_nothing", "even"])
def test_gradient_is_the_reverse_alltoall(pattern_name, mode, rank, size):
    # d sum(w_rank * alltoall(x)) / dx: rank r's weights differ, so the
    # gradient shows which rows went where.
    pattern = _two_rows_each if pattern_name == "even" else (
        SPLIT_PATTERNS[pattern_name])
    trailing = (2,)
    x = tf.constant(_values(rank, sum(pattern(rank, size)), trailing))
    received = _expected_received_splits(rank, size, pattern)
    w = tf.constant(_weights(rank, int(received.sum()), trailing))

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            if pattern_name == "even":
                y = tfring.alltoall(x)
            else:
                y, _ = tfring.alltoall(x, splits=pattern(rank, size))
            loss = tf.reduce_sum(w * y)
        return tape.gradient(loss, x)

    result = _run(grad, mode, x)
    what = f"gradient, {pattern_name} splits ({mode})"
    assert result is not None, f"{what}: no gradient"
    expected = _expected_gradient(rank, size, pattern, trailing)
    assert tuple(result.shape) == expected.shape, (
        f"{what}: shape {result.shape}, expected {expected.shape}")
    np.testing.assert_array_equal(result.numpy(), expected, err_msg=what)


# Bad splits for a tensor of `rows` rows at `size` ranks.
BAD_SPLITS = {
    # At size 1 the only entry is negative, so the sum is wrong as well.
    "negative": lambda rows, size: (
        [-1] if size == 1 else [-1, rows + 1] + [0] * (size - 2)),
    "wrong_sum": lambda rows, size: [rows + 1] + [0] * (size - 1),
    "too_long": lambda rows, size: [rows] + [0] * size,
}


def _check_splits_error(info, faulty_ranks, kind, what):
    message = info.value.message
    assert "splits" in message, f"{what}: message mentions splits: {message}"
    for r in faulty_ranks:
        assert f"rank {r}" in message, (
            f"{what}: message names rank {r} (at fault): {message}")
    if kind == "negative":
        assert "-1" in message or "negative" in message, (
            f"{what}: message shows the negative split: {message}")


@pytest.mark.parametrize("kind", sorted(BAD_SPLITS))
def test_bad_splits_on_every_rank(kind, rank, size):
    rows = 3
    x = tf.ones([rows, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits") as info:
        tfring.alltoall(x, splits=BAD_SPLITS[kind](rows, size))
    _check_splits_error(info, range(size), kind,
                        f"{kind} splits on every rank, seen by rank {rank}")
    _still_works(rank, size)


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(BAD_SPLITS))
def test_bad_splits_on_one_rank_fail_everywhere(kind, mode, rank, size):
    # Only rank 1 is wrong; the others' splits are fine and they still must
    # all get the error, which names rank 1.
    rows = 3
    x = tf.ones([rows, 2])
    splits = (BAD_SPLITS[kind](rows, size) if rank == 1
              else [rows] + [0] * (size - 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits") as info:
        _run(lambda: tfring.alltoall(x, splits=splits), mode)
    _check_splits_error(info, [1], kind,
                        f"{kind} splits on rank 1, seen by rank {rank} "
                        f"({mode})")
    _still_works(rank, size)


@pytest.mark.requires_ranks(2)
def test_even_split_of_indivisible_first_dimension(rank, size):
    rows = size + 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits") as info:
        tfring.alltoall(tf.ones([rows, 2]))
    message = info.value.message
    assert str(rows) in message and str(size) in message, (
        f"splits=None with {rows} rows at {size} ranks: message names both "
        f"sizes: {message}")
    _still_works(rank, size)


@pytest.mark.requires_ranks(2)
def test_even_split_indivisible_on_one_rank_fails_everywhere(rank, size):
    # Rank 1 alone has a first dimension that does not divide: the others
    # must not wait for it forever.
    rows = size + 1 if rank == 1 else 2 * size
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits") as info:
        tfring.alltoall(tf.ones([rows, 2]))
    assert "rank 1" in info.value.message, (
        f"splits=None, {size + 1} rows on rank 1 only: rank {rank}'s message "
        f"names rank 1: {info.value.message}")
    _still_works(rank, size)


def test_scalar_is_rejected(rank, size):
    with pytest.raises((tf.errors.OpError, ValueError)) as info:
        tfring.alltoall(tf.constant(1.0))
    message = str(info.value).lower()
    assert "scalar" in message or "dimension" in message, (
        f"alltoall of a scalar: message says why: {message}")
    _still_works(rank, size)


def test_xla_rejects_alltoall(rank, size):
    @tf.function(jit_compile=True)
    def step(x):
        return tfring.alltoall(x)

    with pytest.raises(ValueError):
        step(tf.ones([size, 2]))
    _still_works(rank, size)


def test_low_level_op(rank, size):
    # tfring.ops.alltoall_op takes int32 splits; empty means an even split.
    x = _input(rank, size, _mixed, (2,))
    result, received = ops.alltoall_op(
        x, tf.constant(_mixed(rank, size), tf.int32))
    _check(result, received, rank, size, _mixed, (2,), tf.float32,
           "alltoall_op with splits")
    x = _input(rank, size, _one_row_each, ())
    result, received = ops.alltoall_op(x, tf.constant([], tf.int32))
    _check(result, received, rank, size, _one_row_each, (), tf.float32,
           "alltoall_op with empty splits")


def test_compat_v1_graph_session(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        splits = tf.compat.v1.placeholder(tf.int32, [size])
        result, received = tfring.alltoall(x, splits=splits)
        # Every row arriving at rank j is weighted by j + 1.
        (grad,) = tf.gradients(tf.reduce_sum(result * (rank + 1.0)), x)
    with tf.compat.v1.Session(graph=graph) as session:
        for pattern in (_mixed, _last_receives_nothing):
            rows = sum(pattern(rank, size))
            feed = {x: _values(rank, rows, (2,)).astype(np.float32),
                    splits: pattern(rank, size)}
            r, s, g = session.run([result, received, grad], feed_dict=feed)
            what = f"v1 session, {pattern.__name__} splits"
            np.testing.assert_array_equal(
                r, _expected(rank, size, pattern, (2,)), err_msg=what)
            np.testing.assert_array_equal(
                s, _expected_received_splits(rank, size, pattern),
                err_msg=f"{what}: received_splits")
            expected_grad = np.repeat(
                np.arange(1.0, size + 1.0), pattern(rank, size))[:, None] * (
                    np.ones((1, 2)))
            np.testing.assert_array_equal(g, expected_grad,
                                          err_msg=f"{what}: gradient")
