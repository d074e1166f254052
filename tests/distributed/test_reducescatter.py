# tfring.reducescatter, tfring.grouped_reducescatter and
# tfring.grouped_allgather at any number of ranks: Sum and Average on every
# allreduce dtype, first dimensions divisible by the number of ranks, not
# divisible (the first dim0 % size ranks get one extra row, as in Horovod)
# and smaller than it (some ranks get no rows), trailing dimensions,
# prescale/postscale factors, integer Average truncating toward zero
# (exactly, also beyond 2**53), compression, the gradient (Horovod's:
# allgather of the incoming gradient, times size for Sum), ops other than
# Sum/Average and scalars rejected, a shape mismatch between ranks (every
# rank gets the error and the job goes on), groups of tensors of different
# shapes and dtypes, many small collectives in one tf.function (the fusion
# path), XLA, a tf.compat.v1 session and the low-level
# tfring.ops.reducescatter_op; eagerly and in tf.function.
#
# Why: the block a rank keeps is decided by a rule (rank i gets
# n_i = dim0 // size + (i < dim0 % size) rows starting after the blocks of
# ranks < i) that has to agree with what the other ranks keep, so every
# expected block is computed here in NumPy from every rank's deterministic
# input. Values are small integers, exact in every dtype.

import threading

import numpy as np
import pytest
import tensorflow as tf

import tfring
from tfring import ops
from dtype_values import to_float64, to_tensor

REDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16,
                 tf.bfloat16, tf.float32, tf.float64]
FLOAT_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
GATHER_DTYPES = REDUCE_DTYPES + [tf.uint16, tf.int16, tf.bool]
# dim0 1 and 2: smaller than the number of ranks at 2 and 3 ranks; 5 and 7:
# not divisible at 2 or 3; 6: divisible at 1, 2 and 3.
SHAPES = [(1, 3), (2, 2), (5,), (7, 2), (6, 2, 2)]
OPS = ["Sum", "Average"]
MODES = ["eager", "function"]


def _run(fn, mode, *args):
    """fn(*args) eagerly or as a tf.function."""
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def _block(dim0, rank, size):
    """(start, rows) of the block of dimension 0 that `rank` keeps."""
    base, extra = divmod(dim0, size)
    counts = [base + (i < extra) for i in range(size)]
    return sum(counts[:rank]), counts[rank]


def _values(shape, dtype, rank):
    """Rank `rank`'s input: integers in [-5, 5] ([0, 10] unsigned),
    different on every rank and element."""
    count = int(np.prod(shape, dtype=np.int64))
    values = (5 * np.arange(count) + 3 * rank) % 11
    if not dtype.is_unsigned:
        values = values - 5
    return values.reshape(shape).astype(np.int64)


def _truncating_division(values, divisor):
    """Integer division rounding toward zero, elementwise, in Python ints."""
    flat = [(abs(int(v)) // divisor) * (1 if v >= 0 else -1)
            for v in np.ravel(values)]
    return np.array(flat, np.int64).reshape(np.shape(values))


def _reduced(shape, dtype, op, size, prescale=1.0, postscale=1.0):
    """The reduction over ranks of the whole tensor, before scattering."""
    total = sum(_values(shape, dtype, r) for r in range(size))
    if op == "Average" and dtype.is_integer:
        return _truncating_division(total, size).astype(np.float64)
    result = total.astype(np.float64) * prescale * postscale
    return result / size if op == "Average" else result


def _scattered(full, rank, size):
    start, rows = _block(full.shape[0], rank, size)
    return full[start:start + rows]


def _tolerance(dtype):
    if dtype in (tf.float16, tf.bfloat16):
        return 2e-2
    return 1e-6 if dtype.is_floating else 0.0


def _assert_close(result, expected, dtype, what):
    assert result.dtype == dtype, f"{what}: dtype {result.dtype}"
    assert tuple(result.shape) == expected.shape, (
        f"{what}: shape {result.shape}, expected {expected.shape}")
    tol = _tolerance(dtype)
    np.testing.assert_allclose(to_float64(result), expected, rtol=tol,
                               atol=tol, err_msg=what)


def _still_works(rank, size):
    """A correct reducescatter after an error: the job goes on."""
    shape = (2 * size + 1, 2)
    result = tfring.reducescatter(to_tensor(
        _values(shape, tf.float32, rank).astype(np.float64), tf.float32),
        op=tfring.Sum)
    _assert_close(result, _scattered(_reduced(shape, tf.float32, "Sum", size),
                                     rank, size),
                  tf.float32, "reducescatter after an error")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS)
def test_every_dtype_and_shape(op, mode, rank, size):
    cases = [(d, s) for d in REDUCE_DTYPES for s in SHAPES]
    inputs = [to_tensor(_values(s, d, rank).astype(np.float64), d)
              for d, s in cases]
    reduce_op = getattr(tfring, op)

    def run(tensors):
        return [tfring.reducescatter(x, op=reduce_op) for x in tensors]

    results = _run(run, mode, inputs)
    assert len(results) == len(cases), "one result per reducescatter"
    for (dtype, shape), result in zip(cases, results):
        expected = _scattered(_reduced(shape, dtype, op, size), rank, size)
        _assert_close(result, expected, dtype,
                      f"{op} {dtype.name} {list(shape)} ({mode})")


def test_default_op_is_average(rank, size):
    shape = (size + 1, 2)
    result = tfring.reducescatter(tf.constant(
        _values(shape, tf.float64, rank).astype(np.float64)))
    _assert_close(result, _scattered(_reduced(shape, tf.float64, "Average",
                                              size), rank, size),
                  tf.float64, "reducescatter without op (Average)")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64], ids=lambda d: d.name)
def test_integer_average_truncates_toward_zero(dtype, mode, rank, size):
    # Sums that do not divide by 2 or 3, positive and negative (floor
    # division would round the negatives down), and values beyond 2**53 in
    # int64 (exact only without a detour through double).
    big = 2**60 + 3 if dtype == tf.int64 else 2**29 + 3

    def rank_values(r):
        return [r * r + 1, -(r * r + 1), r * r + 2, -(r * r + 2),
                1 if r == 0 else 0, -1 if r == 0 else 0, big + r, -(big + r)]

    x = tf.constant(rank_values(rank), dtype)
    result = _run(lambda: tfring.reducescatter(x, op=tfring.Average), mode)
    sums = [sum(rank_values(r)[i] for r in range(size)) for i in range(8)]
    averages = [abs(s) // size * (1 if s >= 0 else -1) for s in sums]
    start, rows = _block(8, rank, size)
    what = f"{dtype.name} Average of sums {sums} at {size} ranks ({mode})"
    assert result.dtype == dtype, what
    assert result.numpy().tolist() == averages[start:start + rows], what


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS)
def test_scale_factors(op, mode, rank, size):
    shape = (2 * size + 1, 3)
    factors = [(2.0, 0.25), (0.5, 3.0), (1.0, -2.0)]
    cases = [(d, f) for d in FLOAT_DTYPES for f in factors]
    inputs = [to_tensor(_values(shape, d, rank).astype(np.float64), d)
              for d, _ in cases]
    reduce_op = getattr(tfring, op)

    def run(tensors):
        return [tfring.reducescatter(x, op=reduce_op, prescale_factor=pre,
                                     postscale_factor=post)
                for x, (_, (pre, post)) in zip(tensors, cases)]

    for (dtype, (pre, post)), result in zip(cases, _run(run, mode, inputs)):
        expected = _scattered(_reduced(shape, dtype, op, size, pre, post),
                              rank, size)
        _assert_close(result, expected, dtype,
                      f"{op} {dtype.name} prescale {pre} postscale {post} "
                      f"({mode})")


def test_fp16_compression(rank, size):
    shape = (size + 2, 2)
    tensors = [to_tensor(_values(shape, d, rank).astype(np.float64), d)
               for d in (tf.float32, tf.float64)]
    for x in tensors:
        result = tfring.reducescatter(x, op=tfring.Sum,
                                      compression=tfring.Compression.fp16)
        _assert_close(result, _scattered(_reduced(shape, x.dtype, "Sum",
                                                  size), rank, size),
                      x.dtype, f"{x.dtype.name} with fp16 compression")


def _weights(rows, trailing, rank):
    """Rank `rank`'s incoming gradient: (rank + 1) * (1, 2, 3, ...)."""
    shape = (rows,) + tuple(trailing)
    count = int(np.prod(shape, dtype=np.int64))
    return (rank + 1.0) * (1.0 + np.arange(count)).reshape(shape)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,prescale,postscale", [
    ("Sum", 1.0, 1.0), ("Sum", 2.0, 3.0),
    ("Average", 1.0, 1.0), ("Average", 2.0, 3.0)])
def test_gradient(op, prescale, postscale, mode, rank, size):
    # Horovod's definition: the allgather of every rank's incoming gradient,
    # times size for Sum, times prescale * postscale.
    trailing = (3,)
    dim0 = 2 * size + 1
    x = tf.constant(_values((dim0,) + trailing, tf.float64, rank)
                    .astype(np.float64))
    w = tf.constant(_weights(_block(dim0, rank, size)[1], trailing, rank))

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tfring.reducescatter(x, op=getattr(tfring, op),
                                     prescale_factor=prescale,
                                     postscale_factor=postscale)
            loss = tf.reduce_sum(w * y)
        return tape.gradient(loss, x)

    result = _run(grad, mode, x)
    what = f"gradient of {op} prescale {prescale} postscale {postscale} " \
           f"({mode})"
    assert result is not None, f"{what}: no gradient"
    expected = np.concatenate([
        _weights(_block(dim0, r, size)[1], trailing, r)
        for r in range(size)]) * prescale * postscale
    if op == "Sum":
        expected = expected * size
    assert tuple(result.shape) == expected.shape, (
        f"{what}: shape {result.shape}, expected {expected.shape}")
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12,
                               err_msg=what)


@pytest.mark.parametrize("op", OPS)
def test_gradient_of_ones(op, rank, size):
    # With the default incoming gradient (ones): ones * size for Sum, ones
    # for Average; also when this rank's block is empty (dim0 1).
    for shape in [(3 * size, 2), (1, 2)]:
        x = tf.constant(np.ones(shape))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tfring.reducescatter(x, op=getattr(tfring, op))
        result = tape.gradient(y, x)
        expected = np.ones(shape) * (size if op == "Sum" else 1.0)
        np.testing.assert_allclose(
            result.numpy(), expected,
            err_msg=f"gradient of {op} of {list(shape)} with ones")


def test_other_ops_raise_before_communicating(rank, size):
    # Rank 0 alone calls with the wrong op: if anything were sent, it would
    # wait for the other ranks forever.
    if rank == 0:
        for op in (tfring.Min, tfring.Max, tfring.Product):
            for call in (
                    lambda: tfring.reducescatter(tf.ones([size, 2]), op=op),
                    lambda: tfring.grouped_reducescatter([tf.ones([size])],
                                                         op=op)):
                with pytest.raises(Exception) as info:
                    call()
                message = str(info.value)
                assert "Sum" in message and "Average" in message, (
                    f"op={op!r}: message names the accepted ops: {message}")
    _still_works(rank, size)


@pytest.mark.parametrize("mode", MODES)
def test_scalar_is_rejected_on_every_rank(mode, rank, size):
    x = tf.constant(1.0 + rank)
    with pytest.raises((tf.errors.InvalidArgumentError,
                        tf.errors.FailedPreconditionError)) as info:
        _run(lambda: tfring.reducescatter(x, op=tfring.Sum), mode)
    message = info.value.message.lower()
    assert "scalar" in message or "dimension" in message, (
        f"reducescatter of a scalar ({mode}): message says why: {message}")
    _still_works(rank, size)


@pytest.mark.requires_ranks(2)
def test_shape_mismatch_fails_on_every_rank(rank, size):
    x = tf.ones([3, 2] if rank == 0 else [4, 2])
    with pytest.raises(tf.errors.OpError) as info:
        tfring.reducescatter(x, op=tfring.Sum)
    message = info.value.message
    assert "[3, 2]" in message and "[4, 2]" in message, (
        f"rank 0 [3, 2] against [4, 2]: rank {rank}'s message names both "
        f"shapes: {message}")
    _still_works(rank, size)


GROUP_CASES = [(tf.float32, (2, 3)), (tf.int32, (1,)), (tf.float64, (3, 2, 2)),
               (tf.float16, (5,)), (tf.int8, (4,)), (tf.uint8, (2, 1))]


def _group_inputs(rank, size):
    """Shapes that scale with size: divisible, not, and smaller than it."""
    def dim0(k, rows):
        return [rows, size + rows, 2 * size + 1][k % 3]

    specs = [(d, (dim0(k, s[0]),) + s[1:]) for k, (d, s) in
             enumerate(GROUP_CASES)]
    return specs, [to_tensor(_values(s, d, rank).astype(np.float64), d)
                   for d, s in specs]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS)
def test_grouped_reducescatter(op, mode, rank, size):
    specs, inputs = _group_inputs(rank, size)
    reduce_op = getattr(tfring, op)
    results = _run(lambda ts: tfring.grouped_reducescatter(ts, op=reduce_op),
                   mode, inputs)
    assert isinstance(results, list) and len(results) == len(inputs), (
        f"grouped_reducescatter returns a list of {len(inputs)}: {results}")
    for (dtype, shape), result in zip(specs, results):
        _assert_close(result, _scattered(_reduced(shape, dtype, op, size),
                                         rank, size),
                      dtype, f"grouped {op} {dtype.name} {list(shape)} "
                             f"({mode})")


def test_grouped_reducescatter_scale_factors_and_empty(rank, size):
    assert tfring.grouped_reducescatter([]) == [], "empty group: empty list"
    specs = [(tf.float32, (size + 1, 2)), (tf.float64, (3,)),
             (tf.bfloat16, (2 * size,))]
    inputs = [to_tensor(_values(s, d, rank).astype(np.float64), d)
              for d, s in specs]
    for op in OPS:
        results = tfring.grouped_reducescatter(
            inputs, op=getattr(tfring, op), prescale_factor=2.0,
            postscale_factor=0.5)
        for (dtype, shape), result in zip(specs, results):
            _assert_close(result, _scattered(
                _reduced(shape, dtype, op, size, 2.0, 0.5), rank, size),
                dtype, f"grouped {op} {dtype.name} scaled by 2.0 and 0.5")


def test_grouped_reducescatter_named_groups_run_concurrently(rank, size):
    # Two threads each submit a group at the same time; their names keep
    # them apart (unnamed, both would be `body/reducescatter.0`).
    inputs = {tag: [tf.fill([2 * size, 3], float(rank + scale)),
                    tf.fill([size], float(10 * (rank + scale)))]
              for tag, scale in (("first", 1), ("second", 2))}
    results, errors = {}, []

    def submit(tag):
        try:
            results[tag] = tfring.grouped_reducescatter(
                inputs[tag], op=tfring.Sum, name=f"concurrent_{tag}")
        except Exception as error:  # reported below, on this rank
            errors.append(f"{tag}: {error}")

    threads = [threading.Thread(target=submit, args=(tag,))
               for tag in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for tag, scale in (("first", 1), ("second", 2)):
        total = sum(r + scale for r in range(size))
        wide, narrow = results[tag]
        np.testing.assert_array_equal(wide.numpy(), np.full([2, 3], total),
                                      err_msg=tag)
        np.testing.assert_array_equal(narrow.numpy(), np.full([1], 10 * total),
                                      err_msg=tag)
    with pytest.raises(TypeError, match=r"received name=3\. Expected a str "
                                        r"or None"):
        tfring.grouped_reducescatter([tf.ones([size])], name=3)


def _gather_specs(rank, size):
    """(dtype, rows of rank r, trailing): first dimensions differ by rank,
    rank 0 contributes no rows to some."""
    return [(tf.float32, lambda r: r + 1, (3,)),
            (tf.int64, lambda r: r, ()),
            (tf.float64, lambda r: 2, (2, 2)),
            (tf.bool, lambda r: size - r, (2,)),
            (tf.uint16, lambda r: r % 2, ()),
            (tf.bfloat16, lambda r: r + 2, (1,)),
            (tf.int8, lambda r: 3, (0,))]


def _gather_value(rows, trailing, rank, k):
    shape = (rows,) + tuple(trailing)
    count = int(np.prod(shape, dtype=np.int64))
    return ((np.arange(count) * 3 + 17 * rank + k) % 61).reshape(shape) \
        .astype(np.float64)


def _gathered(dtype, rows_of, trailing, size, k):
    result = np.concatenate([_gather_value(rows_of(r), trailing, r, k)
                             for r in range(size)])
    return result % 2 if dtype == tf.bool else result


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather(mode, rank, size):
    specs = _gather_specs(rank, size)
    inputs = [to_tensor(_gather_value(rows_of(rank), t, rank, k), d)
              for k, (d, rows_of, t) in enumerate(specs)]
    results = _run(lambda ts: tfring.grouped_allgather(ts), mode, inputs)
    assert isinstance(results, list) and len(results) == len(inputs), (
        f"grouped_allgather returns a list of {len(inputs)}: {results}")
    for k, ((dtype, rows_of, trailing), result) in enumerate(
            zip(specs, results)):
        expected = _gathered(dtype, rows_of, trailing, size, k)
        what = f"grouped_allgather {dtype.name} x {list(trailing)} ({mode})"
        assert result.dtype == dtype, what
        assert tuple(result.shape) == expected.shape, (
            f"{what}: shape {result.shape}, expected {expected.shape}")
        np.testing.assert_array_equal(to_float64(result), expected,
                                      err_msg=what)


def test_grouped_allgather_empty(rank, size):
    assert tfring.grouped_allgather([]) == [], "empty group: empty list"


MANY_DTYPES = [tf.float32, tf.float64, tf.int32, tf.float16, tf.int8,
               tf.bool]


@pytest.mark.parametrize("how", ["allgather", "grouped_allgather"])
def test_fifty_small_allgathers_in_one_function(how, rank, size):
    # Small tensors of mixed dtypes submitted together: the fusion path.
    n = 50
    specs = [(MANY_DTYPES[k % len(MANY_DTYPES)], lambda r, k=k: r + k % 3,
              (k % 4 + 1,)) for k in range(n)]
    inputs = [to_tensor(_gather_value(rows_of(rank), t, rank, k), d)
              for k, (d, rows_of, t) in enumerate(specs)]

    @tf.function
    def step(xs):
        if how == "grouped_allgather":
            return tfring.grouped_allgather(xs)
        return [tfring.allgather(x) for x in xs]

    for attempt in range(2):  # the second step may take a cached path
        results = step(inputs)
        for k, ((dtype, rows_of, trailing), result) in enumerate(
                zip(specs, results)):
            expected = _gathered(dtype, rows_of, trailing, size, k)
            what = f"{how} #{k} {dtype.name}, step {attempt}"
            assert result.dtype == dtype, what
            assert tuple(result.shape) == expected.shape, (
                f"{what}: shape {result.shape}, expected {expected.shape}")
            np.testing.assert_array_equal(to_float64(result), expected,
                                          err_msg=what)


def test_fifty_small_reducescatters_in_one_function(rank, size):
    n = 50
    dtypes = [tf.float32, tf.float64, tf.int32, tf.float16, tf.int8]
    specs = [(dtypes[k % len(dtypes)], (k % 7 + 1, k % 3 + 1))
             for k in range(n)]
    inputs = [to_tensor(_values(s, d, rank).astype(np.float64), d)
              for d, s in specs]

    @tf.function
    def step(xs):
        return [tfring.reducescatter(x, op=tfring.Sum) for x in xs]

    for attempt in range(2):
        for k, ((dtype, shape), result) in enumerate(zip(specs,
                                                         step(inputs))):
            _assert_close(result, _scattered(_reduced(shape, dtype, "Sum",
                                                      size), rank, size),
                          dtype, f"reducescatter #{k} {dtype.name} "
                                 f"{list(shape)}, step {attempt}")


def test_xla_compiles_reducescatter(rank, size):
    shape = (2 * size + 1, 2)
    x = tf.constant(_values(shape, tf.float32, rank).astype(np.float32))

    @tf.function(jit_compile=True)
    def step(x):
        return (tfring.reducescatter(x, op=tfring.Sum),
                tfring.reducescatter(x, op=tfring.Average))

    summed, averaged = step(x)
    for op, result in (("Sum", summed), ("Average", averaged)):
        _assert_close(result, _scattered(_reduced(shape, tf.float32, op,
                                                  size), rank, size),
                      tf.float32, f"{op} under jit_compile=True")


def test_low_level_op(rank, size):
    shape = (size + 1, 2)
    x = tf.constant(_values(shape, tf.float64, rank).astype(np.float64))
    result = ops.reducescatter_op(x, tfring.Sum, prescale_factor=2.0,
                                  postscale_factor=0.5)
    _assert_close(result, _scattered(_reduced(shape, tf.float64, "Sum", size),
                                     rank, size),
                  tf.float64, "reducescatter_op Sum scaled by 2.0 and 0.5")


def test_compat_v1_graph_session(rank, size):
    shape = (2 * size + 1, 2)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, [None, 2])
        summed = tfring.reducescatter(x, op=tfring.Sum)
        averaged = tfring.reducescatter(x, op=tfring.Average)
        grouped = tfring.grouped_reducescatter([x, 2.0 * x], op=tfring.Sum)
        gathered = tfring.grouped_allgather([x[:rank], x[:1]])
        (grad,) = tf.gradients(tf.reduce_sum(summed) * (rank + 1.0), x)
    with tf.compat.v1.Session(graph=graph) as session:
        for step in range(2):
            value = _values(shape, tf.float64, rank).astype(np.float64) + step
            s, a, g, ga, d = session.run(
                [summed, averaged, grouped, gathered, grad],
                feed_dict={x: value})
            total = sum(_values(shape, tf.float64, r) for r in range(size)) \
                + size * step
            what = f"v1 session, step {step}"
            np.testing.assert_allclose(s, _scattered(total, rank, size),
                                       err_msg=f"{what}: Sum")
            np.testing.assert_allclose(a, _scattered(total / size, rank, size),
                                       err_msg=f"{what}: Average")
            np.testing.assert_allclose(g[0], _scattered(total, rank, size),
                                       err_msg=f"{what}: grouped")
            np.testing.assert_allclose(g[1], 2.0 * _scattered(total, rank,
                                                              size),
                                       err_msg=f"{what}: grouped, doubled")
            values = [_values(shape, tf.float64, r) + step
                      for r in range(size)]
            np.testing.assert_array_equal(
                ga[0], np.concatenate([values[r][:r] for r in range(size)]),
                err_msg=f"{what}: grouped_allgather, r rows from rank r")
            np.testing.assert_array_equal(
                ga[1], np.concatenate([values[r][:1] for r in range(size)]),
                err_msg=f"{what}: grouped_allgather, first rows")
            # Rank r weighs its block by r + 1; Sum's gradient is the
            # gathered weights times size.
            weights = np.concatenate([
                np.full((_block(shape[0], r, size)[1], 2), r + 1.0)
                for r in range(size)])
            np.testing.assert_allclose(d, weights * size,
                                       err_msg=f"{what}: gradient")
