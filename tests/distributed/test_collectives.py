# allreduce / grouped_allreduce / allgather / broadcast at any number of
# ranks: every op x dtype x 0-3 dimensions (and zero-size), eagerly and in
# tf.function, IndexedSlices, compression, scale factors, many tensors in one
# step submitted in a different order on every rank, sizes around the fusion
# threshold, and a tf.compat.v1 session.

import numpy as np
import pytest
import tensorflow as tf

import tfring
from dtype_values import to_tensor

REDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16,
                 tf.bfloat16, tf.float32, tf.float64]
GATHER_DTYPES = REDUCE_DTYPES + [tf.uint16, tf.int16, tf.bool]
SHAPES = [(), (0,), (5,), (3, 4), (2, 3, 2), (2, 0, 3)]
OPS = ["Sum", "Average", "Min", "Max", "Product"]


def _base(shape, dtype, seed):
    """Small integers, the same on every rank (exact in every dtype)."""
    rng = np.random.default_rng(seed)
    low = 0 if (dtype.is_unsigned or dtype == tf.bool) else -5
    return rng.integers(low, 6, size=shape).astype(np.int64)


def _rank_value(shape, dtype, rank, op, seed=0):
    base = _base(shape, dtype, seed)
    if op == "Product":
        return base % 3 + 1 + rank % 2  # in [1, 4]: no overflow at 3 ranks
    return base + rank


def _reduce_expected(shape, dtype, op, size, seed=0):
    stack = np.stack([_rank_value(shape, dtype, r, op, seed)
                      for r in range(size)])
    if op == "Sum":
        return stack.sum(axis=0).astype(np.float64)
    if op == "Min":
        return stack.min(axis=0).astype(np.float64)
    if op == "Max":
        return stack.max(axis=0).astype(np.float64)
    if op == "Product":
        return stack.prod(axis=0).astype(np.float64)
    total = stack.sum(axis=0).astype(np.float64)
    if dtype.is_integer:
        # The core scales integers in double and rounds toward zero.
        return np.trunc(total * (1.0 / size))
    return total / size


def _tolerance(dtype):
    if dtype in (tf.float16, tf.bfloat16):
        return 2e-2
    return 1e-6 if dtype.is_floating else 0.0


def _assert_close(result, expected, dtype, what):
    got = tf.cast(result, tf.float64).numpy()
    assert got.shape == np.shape(expected), what
    tol = _tolerance(dtype)
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol,
                               err_msg=what)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", OPS)
def test_allreduce_every_op_dtype_and_rank(op, mode, size, rank):
    cases = [(d, s) for d in REDUCE_DTYPES for s in SHAPES]
    inputs = [to_tensor(_rank_value(s, d, rank, op), d) for d, s in cases]
    reduce_op = getattr(tfring, op)

    def run(tensors):
        return [tfring.allreduce(t, op=reduce_op) for t in tensors]

    results = run(inputs) if mode == "eager" else tf.function(run)(inputs)
    for (dtype, shape), result in zip(cases, results):
        assert result.dtype == dtype
        _assert_close(result, _reduce_expected(shape, dtype, op, size),
                      dtype, f"{op} {dtype.name} {shape}")


def test_allreduce_default_op_is_average(size, rank):
    result = tfring.allreduce(tf.constant([2.0 * rank, 4.0]))
    expected = [2.0 * sum(range(size)) / size, 4.0]
    np.testing.assert_allclose(result.numpy(), expected)


def test_allreduce_of_variable_and_numpy(size, rank):
    v = tf.Variable([1.0, float(rank)])
    np.testing.assert_allclose(
        tfring.allreduce(v, op=tfring.Sum).numpy(),
        [size, sum(range(size))])
    np.testing.assert_allclose(
        tfring.allreduce(np.array([rank], np.int64), op=tfring.Max).numpy(),
        [size - 1])


def test_deprecated_average_argument(size, rank):
    x = tf.constant([float(rank)])
    with pytest.warns(DeprecationWarning):
        averaged = tfring.allreduce(x, average=True)
    with pytest.warns(DeprecationWarning):
        summed = tfring.allreduce(x, average=False)
    np.testing.assert_allclose(averaged.numpy(), [sum(range(size)) / size])
    np.testing.assert_allclose(summed.numpy(), [sum(range(size))])
    with pytest.raises(ValueError, match="supersedes the deprecated"):
        tfring.allreduce(x, average=True, op=tfring.Sum)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_scale_factors(mode, size, rank):
    floats = tf.constant([1.0 + rank, -2.0])
    ints = tf.constant([3 + rank, -7], tf.int32)

    def run():
        return (tfring.allreduce(floats, op=tfring.Sum, prescale_factor=2.0,
                                 postscale_factor=0.25),
                tfring.allreduce(floats, op=tfring.Average,
                                 prescale_factor=3.0),
                tfring.allreduce(ints, op=tfring.Sum, prescale_factor=2.0,
                                 postscale_factor=0.5))

    f_sum, f_avg, i_sum = run() if mode == "eager" else tf.function(run)()
    float_total = np.array([size + sum(range(size)), -2.0 * size])
    np.testing.assert_allclose(f_sum.numpy(), float_total * 0.5, rtol=1e-6)
    np.testing.assert_allclose(f_avg.numpy(), float_total * 3.0 / size,
                               rtol=1e-6)
    int_total = np.array([2 * (3 * size + sum(range(size))), -14 * size])
    np.testing.assert_array_equal(i_sum.numpy(),
                                  np.trunc(int_total * 0.5).astype(np.int32))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_fp16_compression(mode, size, rank):
    tensors = [tf.constant([0.5 + rank, 2.25], tf.float32),
               tf.constant([[1.5 * rank]], tf.float64),
               tf.constant([rank, 1], tf.int32)]

    def run():
        return [tfring.allreduce(t, op=tfring.Sum,
                                 compression=tfring.Compression.fp16)
                for t in tensors]

    results = run() if mode == "eager" else tf.function(run)()
    assert [r.dtype for r in results] == [tf.float32, tf.float64, tf.int32]
    ranks = sum(range(size))
    np.testing.assert_allclose(results[0].numpy(), [0.5 * size + ranks,
                                                    2.25 * size])
    np.testing.assert_allclose(results[1].numpy(), [[1.5 * ranks]])
    np.testing.assert_array_equal(results[2].numpy(), [ranks, size])
    c, ctx = tfring.Compression.fp16.compress(tensors[0])
    assert c.dtype == tf.float16
    assert tfring.Compression.fp16.decompress(c, ctx).dtype == tf.float32
    n, ctx = tfring.Compression.none.compress(tensors[0])
    assert n is tensors[0] and ctx is None


def _rank_slices(rank):
    values = tf.constant([[rank + 1.0] * 3, [2.0 * (rank + 1)] * 3])
    indices = tf.constant([rank % 4, 5], tf.int64)
    return tf.IndexedSlices(values, indices,
                            dense_shape=tf.constant([6, 3], tf.int64))


def _dense(slices, rows=6):
    return tf.math.unsorted_segment_sum(slices.values, slices.indices,
                                        rows).numpy()


def _dense_sum_of_slices(size):
    return sum(_dense(_rank_slices(r)) for r in range(size))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_allreduce_indexed_slices(op, mode, size, rank):
    def run(slices):
        return tfring.allreduce(slices, op=getattr(tfring, op))

    slices = _rank_slices(rank)
    result = run(slices) if mode == "eager" else tf.function(run)(slices)
    assert isinstance(result, tf.IndexedSlices)
    assert result.values.shape[0] == 2 * size
    expected = _dense_sum_of_slices(size)
    if op == "Average":
        expected = expected / size
    np.testing.assert_allclose(_dense(result), expected, rtol=1e-6)
    np.testing.assert_array_equal(result.dense_shape.numpy(), [6, 3])


def _truncating_division(value, divisor):
    quotient = abs(value) // divisor
    return quotient if value >= 0 else -quotient


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_integer_average_dense_is_exact_slices_are_divided_as_horovod(
        dtype, size, rank):
    # Integer Average divides in integer arithmetic, truncating toward zero;
    # no value passes through a double (int64 beyond 2**53 stays exact).
    big = 2**60 + 3 if dtype == tf.int64 else 2**29 + 3  # no overflow at 3 ranks

    def rank_values(r):
        return [big + r, -7 - r]

    local = tf.constant([[v] for v in rank_values(rank)], dtype)
    dense = tfring.allreduce(local, op=tfring.Average)
    sums = [sum(rank_values(r)[i] for r in range(size)) for i in range(2)]
    assert dense.numpy().tolist() == [
        [_truncating_division(v, size)] for v in sums]

    # IndexedSlices follow Horovod: the gathered values divided with
    # TensorFlow's `/`, so integers come back as float64.
    slices = tf.IndexedSlices(local, tf.constant([0, 1]),
                              dense_shape=tf.constant([2, 1]))
    result = tfring.allreduce(slices, op=tfring.Average)
    assert result.values.dtype == tf.float64
    np.testing.assert_array_equal(
        result.values.numpy(),
        [[np.float64(v) / size] for r in range(size) for v in rank_values(r)])


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64,
                                   tf.int32])
def test_indexed_slices_average_is_horovods_division_bit_for_bit(
        dtype, size, rank):
    # Horovod divides the gathered values by the size eagerly. Inside a
    # tf.function (where eager grouped calls run) Grappler would multiply by
    # the reciprocal instead, which differs in the last bit at 3 ranks.
    values = np.random.RandomState(rank).uniform(-100, 100, [3, 5])
    slices = tf.IndexedSlices(tf.cast(values, dtype),
                              tf.constant([0, rank, 2]),
                              dense_shape=tf.constant([size + 2, 5]))
    gathered = tfring.allgather(slices.values)
    expected = (gathered / tf.cast(size, dtype)).numpy()
    single = tfring.allreduce(slices, op=tfring.Average)
    grouped = tfring.grouped_allreduce([tf.ones([2]), slices, slices],
                                       op=tfring.Average)
    for what, result in [("allreduce", single), ("grouped, first", grouped[1]),
                         ("grouped, second", grouped[2])]:
        assert result.values.dtype == expected.dtype, what
        np.testing.assert_array_equal(result.values.numpy(), expected,
                                      err_msg=what)
        np.testing.assert_array_equal(
            result.indices.numpy(),
            [i for r in range(size) for i in (0, r, 2)], err_msg=what)


@pytest.mark.parametrize("op", ["Min", "Max", "Product"])
def test_indexed_slices_reject_other_ops(op, rank):
    # NotImplementedError, Horovod's type, with the fix.
    with pytest.raises(NotImplementedError,
                       match=rf"op=tfring\.{op}\. Expected op=tfring\.Sum or "
                             r"tfring\.Average .*sparse_as_dense=True"):
        tfring.allreduce(_rank_slices(rank), op=getattr(tfring, op))


@pytest.mark.parametrize("call", ["allreduce", "grouped_allreduce"])
def test_indexed_slices_reject_scale_factors(call, rank):
    with pytest.raises(NotImplementedError,
                       match=r"prescale_factor=0\.5 and postscale_factor=1\.0\. "
                             r"Expected 1\.0 for both"):
        if call == "allreduce":
            tfring.allreduce(_rank_slices(rank), prescale_factor=0.5)
        else:
            tfring.grouped_allreduce([tf.ones([2]), _rank_slices(rank)],
                                     prescale_factor=0.5)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", ["Sum", "Average", "Max"])
def test_grouped_allreduce(op, mode, size, rank):
    reduce_op = getattr(tfring, op)
    tensors = [tf.fill([k + 1, 2], float(rank + k)) for k in range(7)]
    tensors += [tf.constant([rank, 7], tf.int64),
                tf.constant(float(rank), tf.float16)]
    if op != "Max":
        tensors.append(_rank_slices(rank))

    def run(ts):
        return tfring.grouped_allreduce(ts, op=reduce_op)

    results = run(tensors) if mode == "eager" else tf.function(run)(tensors)
    assert isinstance(results, list) and len(results) == len(tensors)
    singles = [tfring.allreduce(t, op=reduce_op) for t in tensors]
    for got, want in zip(results, singles):
        if isinstance(want, tf.IndexedSlices):
            assert isinstance(got, tf.IndexedSlices)
            np.testing.assert_allclose(_dense(got), _dense(want))
        else:
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(tf.cast(got, tf.float64).numpy(),
                                       tf.cast(want, tf.float64).numpy())


def test_grouped_allreduce_members_are_submitted_as_one_group(rank):
    # The dense members of one grouped call carry one group key and their
    # count, so the core wakes once for the group; IndexedSlices members and
    # separate calls are not part of it.
    def run(ts, slices):
        grouped = tfring.grouped_allreduce(ts + [slices], op=tfring.Sum)
        again = tfring.grouped_allreduce(ts[:2], op=tfring.Sum)
        single = tfring.allreduce(ts[0], op=tfring.Sum)
        return grouped, again, single

    tensors = [tf.ones([k + 1]) for k in range(3)]
    graph = tf.function(run).get_concrete_function(
        tensors, _rank_slices(rank)).graph
    groups = [(op.get_attr("group_key"), op.get_attr("group_size"))
              for op in graph.get_operations()
              if op.type == "Tfring>Allreduce"]
    assert len(groups) == 6, groups
    first, second, single = groups[:3], groups[3:5], groups[5]
    assert len(set(first)) == 1 and first[0][1] == 3 and first[0][0] > 0
    assert len(set(second)) == 1 and second[0][1] == 2
    assert second[0][0] != first[0][0]
    assert single == (0, 1)


def test_grouped_allreduce_empty_and_compression(size, rank):
    assert tfring.grouped_allreduce([]) == []
    results = tfring.grouped_allreduce(
        [tf.constant([rank + 0.5]), tf.constant([2.0], tf.float64)],
        op=tfring.Sum, compression=tfring.Compression.fp16,
        prescale_factor=2.0)
    assert [r.dtype for r in results] == [tf.float32, tf.float64]
    np.testing.assert_allclose(results[0].numpy(),
                               [2 * (sum(range(size)) + 0.5 * size)])
    np.testing.assert_allclose(results[1].numpy(), [4.0 * size])


def _gather_value(rows, trailing, dtype, rank):
    shape = (rows,) + trailing
    values = (np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
              % 7 + 10 * rank)
    if dtype == tf.bool:
        return values % 2 == 1
    return values


def _gather_tensor(rows, trailing, dtype, rank):
    values = _gather_value(rows, trailing, dtype, rank)
    if dtype == tf.bool:
        return tf.constant(values)
    return tf.cast(tf.constant(values), dtype)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_allgather_every_dtype_and_rank(mode, size, rank):
    # Rank r contributes r rows (rank 0 none) and then r + 1 rows.
    cases = [(d, t, rows_of) for d in GATHER_DTYPES
             for t in [(), (3,), (2, 2)]
             for rows_of in (lambda r: r, lambda r: r + 1)]
    inputs = [_gather_tensor(rows_of(rank), t, d, rank)
              for d, t, rows_of in cases]

    def run(tensors):
        return [tfring.allgather(x) for x in tensors]

    results = run(inputs) if mode == "eager" else tf.function(run)(inputs)
    for (dtype, trailing, rows_of), result in zip(cases, results):
        expected = np.concatenate([
            _gather_value(rows_of(r), trailing, dtype, r)
            for r in range(size)]).astype(np.float64)
        assert result.dtype == dtype
        _assert_close(result, expected, dtype,
                      f"allgather {dtype.name} {trailing}")


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_broadcast_every_dtype_rank_and_root(mode, size, rank):
    shapes = [(), (0,), (4,), (2, 3), (2, 1, 2)]
    cases = [(d, s, root) for d in GATHER_DTYPES for s in shapes
             for root in range(size)]
    inputs = [to_tensor(_rank_value(s, d, rank, "Sum"), d)
              for d, s, _ in cases]

    def run(tensors):
        return [tfring.broadcast(x, root)
                for x, (_, _, root) in zip(tensors, cases)]

    results = run(inputs) if mode == "eager" else tf.function(run)(inputs)
    for (dtype, shape, root), result in zip(cases, results):
        expected = _rank_value(shape, dtype, root, "Sum")
        if dtype == tf.bool:
            expected = expected % 2 == 1
        assert result.dtype == dtype
        _assert_close(result, expected.astype(np.float64), dtype,
                      f"broadcast {dtype.name} {shape} root {root}")


def test_explicit_names_in_eager_mode(size, rank):
    for step in range(3):
        s = tfring.allreduce(tf.constant([1.0 * step]), op=tfring.Sum,
                             name="eager.loss")
        g = tfring.allgather(tf.constant([rank]), name="eager.ranks")
        b = tfring.broadcast(tf.constant([rank]), 0, "eager.root")
        np.testing.assert_allclose(s.numpy(), [step * size])
        np.testing.assert_array_equal(g.numpy(), list(range(size)))
        np.testing.assert_array_equal(b.numpy(), [0])


def test_submission_order_differs_per_rank(size, rank):
    # 50 tensors whose inputs become ready in a different random order on
    # every rank (a control-dependency chain with some work per link), so
    # the allreduces reach the core in different orders.
    n = 50
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 3000, size=n)
    order = np.random.default_rng(1000 + rank).permutation(n)
    inputs = [tf.fill([int(s)], float(k + rank)) for k, s in enumerate(sizes)]
    work = tf.random.stateless_uniform([48, 48], seed=[1, 2])

    @tf.function
    def step(xs):
        ready = [None] * n
        previous = None
        for k in order:
            deps = [] if previous is None else [previous]
            with tf.control_dependencies(deps):
                busy = tf.reduce_sum(tf.matmul(work, work))
                ready[k] = tf.identity(xs[k])
            previous = tf.group(ready[k], busy)
        return [tfring.allreduce(ready[k], op=tfring.Sum) for k in range(n)]

    for _ in range(3):
        results = step(inputs)
        for k, result in enumerate(results):
            expected = size * k + sum(range(size))
            assert result.shape == (sizes[k],)
            np.testing.assert_allclose(result.numpy(), expected)


def test_two_hundred_tensors_in_one_step(size, rank):
    rng = np.random.default_rng(11)
    dtypes = [tf.float32, tf.float64, tf.int32, tf.float16]
    specs = [(dtypes[k % 4], int(rng.integers(1, 2000))) for k in range(200)]
    inputs = [tf.cast(tf.fill([n], k % 5 + rank), d)
              for k, (d, n) in enumerate(specs)]

    @tf.function
    def step(xs):
        return [tfring.allreduce(x, op=tfring.Sum) for x in xs]

    for _ in range(2):  # The second step takes the response-cache path.
        results = step(inputs)
        for k, ((dtype, n), result) in enumerate(zip(specs, results)):
            assert result.dtype == dtype and result.shape == (n,)
            np.testing.assert_allclose(
                tf.cast(result, tf.float64).numpy(),
                (k % 5) * size + sum(range(size)))


def test_sizes_around_the_fusion_threshold(fusion_threshold, size, rank):
    # With TFRING_FUSION_THRESHOLD set small (the driver's fusion variant),
    # these tensors fall just under, at and over it, alone and in batches.
    threshold = fusion_threshold or 4096
    specs = []
    for dtype, itemsize in [(tf.float32, 4), (tf.float64, 8), (tf.int8, 1)]:
        per = threshold // itemsize
        specs += [(dtype, n) for n in (per - 1, per, per + 1, per // 2 + 1,
                                       per // 3, 1)]
    inputs = [tf.cast(tf.fill([n], (k % 3) + rank), d)
              for k, (d, n) in enumerate(specs)]

    @tf.function
    def step(xs):
        return [tfring.allreduce(x, op=tfring.Sum) for x in xs]

    results_eager = [tfring.allreduce(x, op=tfring.Sum) for x in inputs]
    for results in (step(inputs), results_eager):
        for k, ((dtype, n), result) in enumerate(zip(specs, results)):
            assert result.shape == (n,)
            np.testing.assert_allclose(
                tf.cast(result, tf.float64).numpy(),
                (k % 3) * size + sum(range(size)))


def test_compat_v1_graph_session(size, rank):
    with tf.Graph().as_default():
        summed = tfring.allreduce(tf.constant([1.0, 2.0]) * (rank + 1),
                                  op=tfring.Sum)
        averaged = tfring.allreduce(tf.constant([float(rank)]))
        gathered = tfring.allgather(tf.fill([rank + 1], rank))
        root = tfring.broadcast(tf.constant([rank, 5]), size - 1)
        grouped = tfring.grouped_allreduce(
            [tf.constant([1.0]), tf.constant([2], tf.int64)], op=tfring.Sum)
        with tf.compat.v1.Session() as sess:
            for _ in range(2):
                s, a, g, r, gr = sess.run(
                    [summed, averaged, gathered, root, grouped])
                total = size * (size + 1) / 2
                np.testing.assert_allclose(s, [total, 2 * total])
                np.testing.assert_allclose(a, [sum(range(size)) / size])
                np.testing.assert_array_equal(
                    g, np.concatenate([[r_] * (r_ + 1)
                                       for r_ in range(size)]))
                np.testing.assert_array_equal(r, [size - 1, 5])
                np.testing.assert_allclose(gr[0], [size])
                np.testing.assert_array_equal(gr[1], [2 * size])


def test_same_tensor_reduced_twice_in_one_function(size, rank):
    # Two ops on one input must not collide on a name derived from it.
    @tf.function
    def step(x):
        return (tfring.allreduce(x, op=tfring.Sum),
                tfring.allreduce(x, op=tfring.Max))

    x = tf.constant([float(rank)])
    s, m = step(x)
    np.testing.assert_allclose(s.numpy(), [sum(range(size))])
    np.testing.assert_allclose(m.numpy(), [size - 1])
    s, m = step(x)  # Again: the names are stable across steps.
    np.testing.assert_allclose(s.numpy(), [sum(range(size))])


def test_eager_grouped_allreduce_traces_once(size, rank):
    tensors = [tf.fill([3], float(rank)), tf.constant([rank], tf.int64)]
    for _ in range(3):
        results = tfring.grouped_allreduce(tensors, op=tfring.Min,
                                           postscale_factor=1.0)
        np.testing.assert_array_equal(results[1].numpy(), [0])
    functions = [fn for key, fn in
                 tfring.collectives._grouped_functions.items()
                 if key[:2] == ("allreduce", tfring.Min)]
    assert len(functions) == 1
    assert functions[0].experimental_get_tracing_count() == 1
