# Process sets at any number of ranks (and at 4 in a dedicated run):
# tfring.ProcessSet from a list and from an mpi4py communicator, init with
# process sets, every collective inside a set (eagerly and in tf.function,
# and allreduce/broadcast/reducescatter under XLA; one name used in every
# set, built in a different order on each rank), the object helpers,
# DistributedGradientTape, gradients, a Keras model.fit with
# DistributedOptimizer(process_set=...), dynamic sets (add, use, remove),
# and the errors: a set this rank is not in, one that is not registered or
# was removed, a root_rank outside the set, bad init arguments. At 4 ranks,
# the disjoint sets {0, 1} and {2, 3} run different collectives interleaved
# with global ones for many steps and must neither hang nor mix results.
#
# Why: a process set changes who talks to whom. Every expected value is
# rebuilt here from the set's ranks (job ranks, sorted), so a collective that
# leaked into another set, counted the job's size instead of the set's, or
# ordered by the wrong ranks shows up as a wrong number, not only as a hang.
#
# The sets used (none may equal the global set, so with one rank there are
# none and the set tests skip): `lower` = the first ceil(n/2) ranks, `upper`
# = the others, and from 3 ranks `ends` = {0, n-1}, which overlaps both.

import contextlib
import inspect
import random

import numpy as np
import pytest
import tensorflow as tf
import keras
from mpi4py import MPI

import tfring
import tfring.keras as hvd_keras
from tfring import ops
from time_limit import within_time_limit

MODES = ["eager", "function"]
WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()


def _run(fn, mode, *args):
    """fn(*args) eagerly or as a tf.function."""
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def _make_sets():
    if N == 1:
        return {}
    half = (N + 1) // 2
    sets = {"lower": tfring.ProcessSet(list(range(half))),
            "upper": tfring.ProcessSet(list(range(half, N)))}
    if N >= 3:
        sets["ends"] = tfring.ProcessSet([N - 1, 0])  # stored sorted
    return sets


SETS = _make_sets()


def _init_module_sets():
    tfring.init(process_sets=list(SETS.values()))


def _shutdown_together():
    # A shutdown stops every rank at the next negotiation round, so a rank
    # still busy with the previous test's collectives in its own set (no
    # global collective keeps the ranks in step) would see them aborted.
    WORLD.Barrier()
    tfring.shutdown()


@pytest.fixture(scope="module", autouse=True)
def module_sets():
    # conftest started tfring without sets; a second init() is a no-op.
    _shutdown_together()
    _init_module_sets()
    yield SETS
    _shutdown_together()
    tfring.init()  # as conftest left it


@contextlib.contextmanager
def _initialized_with(process_sets):
    """tfring running with `process_sets`; the module's sets afterwards."""
    _shutdown_together()
    try:
        tfring.init(process_sets=process_sets)
        yield
    finally:
        _shutdown_together()
        _init_module_sets()


def _my_sets():
    """(name, set) of the sets this rank is in, in the same order on every
    rank (so each set's collectives run in the same order on its ranks)."""
    return [(k, s) for k, s in SETS.items() if ME in s.ranks]


def _other_sets():
    return [(k, s) for k, s in SETS.items() if ME not in s.ranks]


def _all_sets():
    """The global set and this rank's sets."""
    return [("global", tfring.global_process_set)] + _my_sets()


# --- registration and queries -------------------------------------------


def test_init_registers_the_sets_in_order():
    assert tfring.global_process_set.process_set_id == 0
    assert tfring.global_process_set.ranks == list(range(N))
    assert tfring.global_process_set.size() == N
    assert tfring.global_process_set.rank() == ME
    assert tfring.global_process_set.included() is True
    ids = [s.process_set_id for s in SETS.values()]
    assert ids == list(range(1, len(SETS) + 1))
    table = tfring._core.process_sets()
    assert table[0] == list(range(N))
    for s in SETS.values():
        assert table[s.process_set_id] == s.ranks
        assert s.ranks == sorted(s.ranks)
        assert s.size() == len(s.ranks)
        assert s.included() == (ME in s.ranks)
        if ME in s.ranks:
            assert s.rank() == s.ranks.index(ME)
        else:
            with pytest.raises(ValueError, match=f"rank {ME}, which is not "
                               "in ProcessSet"):
                s.rank()
    if "ends" in SETS:
        assert SETS["ends"].ranks == [0, N - 1]


def test_horovods_internal_table_of_sets():
    # Horovod's process-set tests read the table through this internal
    # function: {id: ranks} with the global set, in id order.
    table = tfring.mpi_ops._basics._get_process_set_ids_and_ranks()
    expected = {0: list(range(N))}
    expected.update({s.process_set_id: s.ranks for s in SETS.values()})
    assert table == expected
    assert list(table) == sorted(table)


def test_str_is_readable():
    s = tfring.ProcessSet([3, 1])
    assert str(s) == "ProcessSet(process_set_id=None, ranks=[1, 3])"
    assert repr(s) == str(s)
    assert str(tfring.global_process_set) == (
        f"ProcessSet(process_set_id=0, ranks={list(range(N))})")
    for s in SETS.values():
        assert str(s) == (f"ProcessSet(process_set_id={s.process_set_id}, "
                          f"ranks={s.ranks})")


def test_unregistered_set_queries():
    s = tfring.ProcessSet([0])
    assert s.process_set_id is None
    assert s.size() is None and s.rank() is None
    assert s.included() == (ME == 0)


@pytest.mark.parametrize("ranks, error, text", [
    ([0, 0], ValueError, "more than once"),
    ([0, "1"], TypeError, "entry of type str"),
    ([True], TypeError, "entry of type bool"),
    ([-1], ValueError, r"\[-1\] are not ranks of the job"),
    (5, TypeError, "Expected a list of job ranks"),
    ("01", TypeError, "Expected a list of job ranks"),
])
def test_process_set_rejects_bad_ranks(ranks, error, text):
    with pytest.raises(error, match=text):
        tfring.ProcessSet(ranks)


def test_process_set_ops():
    for s in [tfring.global_process_set] + list(SETS.values()):
        ps_id = s.process_set_id

        def run():
            return (tfring.size_op(ps_id),
                    tfring.process_set_included_op(ps_id))

        for mode in MODES:
            size, included = _run(run, mode)
            assert int(size) == len(s.ranks)
            assert int(included) == int(ME in s.ranks)
        if ME in s.ranks:
            assert int(ops.process_set_rank_op(ps_id)) == s.ranks.index(ME)
        else:
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=f"rank {ME} is not in process set "
                               f"{ps_id}"):
                ops.process_set_rank_op(ps_id)
    assert int(tfring.size_op()) == N
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="process set 77 does not exist"):
        tfring.size_op(77)


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_process_set_is_where_horovod_puts_it():
    # Positional calls written for Horovod bind to the same parameters.
    def after(fn, previous):
        params = _params(fn)
        return params[params.index(previous) + 1]

    assert after(tfring.init, "comm") == "process_sets"
    for fn, previous in [
            (tfring.allreduce, "name"),
            (tfring.grouped_allreduce, "postscale_factor"),
            (tfring.allgather, "ignore_name_scope"),
            (tfring.grouped_allgather, "ignore_name_scope"),
            (tfring.broadcast, "ignore_name_scope"),
            (tfring.alltoall, "ignore_name_scope"),
            (tfring.reducescatter, "name"),
            (tfring.grouped_reducescatter, "op"),
            (tfring.broadcast_variables, "root_rank"),
            (tfring.broadcast_object, "name"),
            (tfring.allgather_object, "name"),
            (tfring.DistributedGradientTape, "groups"),
            (hvd_keras.DistributedOptimizer.__init__, "groups")]:
        assert after(fn, previous) == "process_set", fn
        default = inspect.signature(fn).parameters["process_set"].default
        assert default is tfring.global_process_set, fn
    assert _params(tfring.size_op)[:2] == ["process_set_id", "name"]
    assert _params(tfring.process_set_included_op)[:2] == [
        "process_set_id", "name"]
    for name in ["ProcessSet", "global_process_set", "add_process_set",
                 "remove_process_set"]:
        assert getattr(hvd_keras, name) is getattr(tfring, name)


# --- collectives inside sets ---------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_sum_and_average_divide_by_the_set_size(mode):
    for _, s in _all_sets():
        ranks = s.ranks

        def run(x):
            return (tfring.allreduce(x, op=tfring.Sum, process_set=s),
                    tfring.allreduce(x, op=tfring.Average, process_set=s),
                    tfring.allreduce(tf.cast(x, tf.int32) * 3,
                                     op=tfring.Average, process_set=s),
                    tfring.allreduce(x, op=tfring.Max, process_set=s))

        total, mean, int_mean, top = _run(
            run, mode, tf.constant([float(ME), 1.0]))
        np.testing.assert_array_equal(total, [sum(ranks), len(ranks)])
        np.testing.assert_allclose(mean, [np.mean(ranks), 1.0])
        # Integer Average: the set's sum divided by the set's size.
        assert list(int_mean.numpy()) == [3 * sum(ranks) // len(ranks), 3]
        np.testing.assert_array_equal(top, [max(ranks), 1.0])


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce(mode):
    for _, s in _all_sets():
        def run(a, b):
            return tfring.grouped_allreduce([a, b], op=tfring.Sum,
                                            process_set=s)

        a, b = _run(run, mode, tf.fill([3], float(ME)),
                    tf.constant([[ME, 1]], tf.int64))
        np.testing.assert_array_equal(a, [sum(s.ranks)] * 3)
        np.testing.assert_array_equal(b, [[sum(s.ranks), len(s.ranks)]])


def test_indexed_slices_average_divides_by_the_set_size():
    for _, s in _all_sets():
        slices = tf.IndexedSlices(tf.constant([[float(ME + 1)]]),
                                  tf.constant([ME]), tf.constant([N, 1]))
        single = tfring.allreduce(slices, op=tfring.Average, process_set=s)
        grouped, = tfring.grouped_allreduce([slices], op=tfring.Average,
                                            process_set=s)
        # Horovod's arithmetic: float32 values divided by the set's size.
        expected = np.array([r + 1 for r in s.ranks],
                            np.float32) / np.float32(len(s.ranks))
        for out in (single, grouped):
            assert list(out.indices.numpy()) == s.ranks
            np.testing.assert_array_equal(out.values.numpy()[:, 0], expected)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_is_in_set_rank_order(mode):
    for _, s in _all_sets():
        def run(x, y):
            one = tfring.allgather(x, process_set=s)
            two = tfring.grouped_allgather([x, y], process_set=s)
            return one, two

        x = tf.fill([ME + 1, 2], ME)   # first dimension differs per rank
        y = tf.constant([float(ME)])
        one, (two_x, two_y) = _run(run, mode, x, y)
        expected = np.concatenate([np.full([r + 1, 2], r) for r in s.ranks])
        np.testing.assert_array_equal(one, expected)
        np.testing.assert_array_equal(two_x, expected)
        np.testing.assert_array_equal(two_y, s.ranks)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_from_a_job_rank_inside_the_set(mode):
    for _, s in _all_sets():
        root = s.ranks[-1]  # a job rank; its position in the set differs

        def run(x):
            return tfring.broadcast(x, root_rank=root, process_set=s)

        out = _run(run, mode, tf.constant([ME * 10, 7]))
        np.testing.assert_array_equal(out, [root * 10, 7])


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_has_one_split_per_set_member(mode):
    for _, s in _all_sets():
        k, me = len(s.ranks), s.ranks.index(ME)
        # Send j + 1 rows of value 100 * rank + j to the set's j-th rank.
        splits = [j + 1 for j in range(k)]
        rows = np.concatenate([np.full([j + 1, 1], 100 * ME + j)
                               for j in range(k)]).astype(np.int32)

        def run(x, sp):
            return tfring.alltoall(x, splits=sp, process_set=s)

        out, received = _run(run, mode, tf.constant(rows),
                             tf.constant(splits))
        expected = np.concatenate([np.full([me + 1, 1], 100 * r + me)
                                   for r in s.ranks])
        np.testing.assert_array_equal(out, expected)
        assert list(received.numpy()) == [me + 1] * k
        even = _run(lambda x: tfring.alltoall(x, process_set=s), mode,
                    tf.fill([k], ME))
        np.testing.assert_array_equal(even, s.ranks)


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_gives_block_i_to_the_ith_member(mode):
    for _, s in _all_sets():
        k, me = len(s.ranks), s.ranks.index(ME)
        x = tf.reshape(tf.range(2 * k + 1, dtype=tf.float32), [-1, 1]) \
            + float(ME)

        def run(x):
            return (tfring.reducescatter(x, op=tfring.Sum, process_set=s),
                    tfring.reducescatter(x, op=tfring.Average,
                                         process_set=s),
                    tfring.grouped_reducescatter([x, 2 * x], op=tfring.Sum,
                                                 process_set=s))

        summed, mean, (g1, g2) = _run(run, mode, x)
        full = np.arange(2 * k + 1)[:, None] * k + sum(s.ranks)
        # 2k + 1 rows: the set's first rank gets 3, the others 2.
        start = 0 if me == 0 else 3 + 2 * (me - 1)
        block = full[start:start + (3 if me == 0 else 2)]
        np.testing.assert_array_equal(summed, block)
        np.testing.assert_allclose(mean, block / k)
        np.testing.assert_array_equal(g1, block)
        np.testing.assert_array_equal(g2, 2 * block)


def test_collectives_under_xla():
    for _, s in _all_sets():
        k = len(s.ranks)

        @tf.function(jit_compile=True)
        def run(x):
            return (tfring.allreduce(x, op=tfring.Sum, process_set=s),
                    tfring.broadcast(x, root_rank=s.ranks[-1],
                                     process_set=s),
                    tfring.reducescatter(tf.tile(x[None], [k, 1]),
                                         op=tfring.Sum, process_set=s))

        total, root, block = run(tf.constant([float(ME), 1.0]))
        np.testing.assert_array_equal(total, [sum(s.ranks), k])
        np.testing.assert_array_equal(root, [s.ranks[-1], 1.0])
        assert block.shape == (1, 2)
        np.testing.assert_array_equal(block, [[sum(s.ranks), k]])
        hlo = run.experimental_get_compiler_ir(
            tf.constant([1.0, 1.0]))(stage="hlo")
        assert f"process_set_id = {s.process_set_id} : i32" in hlo


# --- helpers, tape, gradients --------------------------------------------


def test_broadcast_variables_and_objects_in_a_set():
    for _, s in _my_sets():
        root = s.ranks[-1]
        v = tf.Variable([float(ME), 2.0])
        tfring.broadcast_variables([v], root_rank=root, process_set=s)
        np.testing.assert_array_equal(v.numpy(), [root, 2.0])
        w = tf.Variable(float(ME))

        @tf.function
        def in_function():
            tfring.broadcast_variables([w], root, process_set=s)

        in_function()
        assert float(w.numpy()) == root
        obj = tfring.broadcast_object({"from": ME}, root_rank=root,
                                      process_set=s)
        assert obj == {"from": root}
        gathered = tfring.allgather_object(("rank", ME), process_set=s)
        assert gathered == [("rank", r) for r in s.ranks]


@pytest.mark.parametrize("mode", MODES)
def test_distributed_gradient_tape_averages_within_the_set(mode):
    for _, s in _all_sets():
        w = tf.Variable([1.0, 2.0])

        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * x)
            tape = tfring.DistributedGradientTape(tape, process_set=s)
            return tape.gradient(loss, [w])[0]

        grad = _run(step, mode, tf.constant([float(ME), 1.0]))
        np.testing.assert_allclose(grad, [np.mean(s.ranks), 1.0])
        summed = _run(
            lambda x: _tape_sum(w, x, s), mode, tf.constant([float(ME), 1.0]))
        np.testing.assert_allclose(summed, [sum(s.ranks), len(s.ranks)])


def _tape_sum(w, x, s):
    with tfring.DistributedGradientTape(tf.GradientTape(), op=tfring.Sum,
                                        process_set=s) as tape:
        loss = tf.reduce_sum(w * x)
    return tape.gradient(loss, w)


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_gradient_tape_outside_the_set_returns_this_ranks_gradients(mode):
    # Horovod's rule: the same code runs on every rank; the set's ranks
    # average, the others keep their own gradients. Local sources are
    # divided by the set's size everywhere; sparse_as_dense densifies
    # everywhere.
    for _, s in SETS.items():
        k = len(s.ranks)
        w = tf.Variable([1.0, 2.0])
        local = tf.Variable([3.0])
        table = tf.Variable(tf.zeros([N + 1, 2]))

        def step(x):
            with tf.GradientTape() as tape:
                loss = (tf.reduce_sum(w * x) + tf.reduce_sum(local * x[0])
                        + tf.reduce_sum(tf.gather(table, [ME]) * x))
            tape = tfring.DistributedGradientTape(tape, process_set=s,
                                                  sparse_as_dense=True)
            tape.register_local_source(local)
            return tape.gradient(loss, [w, local, table])

        g_w, g_local, g_table = _run(step, mode,
                                     tf.constant([float(ME), 1.0]))
        assert not isinstance(g_table, tf.IndexedSlices)
        if ME in s.ranks:
            np.testing.assert_allclose(g_w, [np.mean(s.ranks), 1.0])
            rows = np.zeros([N + 1, 2])
            for r in s.ranks:
                rows[r] = [r / k, 1.0 / k]
        else:
            np.testing.assert_allclose(g_w, [float(ME), 1.0])
            rows = np.zeros([N + 1, 2])
            rows[ME] = [float(ME), 1.0]
        np.testing.assert_allclose(g_table, rows)
        np.testing.assert_allclose(g_local, [ME / k])


@pytest.mark.requires_ranks(2)
def test_horovods_tape_test_on_every_rank():
    # test_distributed_gradient_tape_process_sets of Horovod's
    # test_tensorflow_process_sets.py, on every set.
    for _, s in SETS.items():
        x = tf.constant(float(ME))
        with tf.GradientTape() as g:
            g.watch(x)
            y = x * x
        dy_dx, = tfring.DistributedGradientTape(g, process_set=s).gradient(
            y, [x])
        expected = 2.0 * (np.mean(s.ranks) if s.included() else ME)
        assert float(dy_dx) == pytest.approx(expected)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_run_in_the_forward_ops_set(mode):
    for _, s in _all_sets():
        k, me = len(s.ranks), s.ranks.index(ME)

        def grads(x):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                gathered = tfring.allgather(x, process_set=s)
                summed = tfring.allreduce(x, op=tfring.Sum, process_set=s)
                scattered = tfring.reducescatter(
                    tf.tile(x, [k]), op=tfring.Sum, process_set=s)
                root = tfring.broadcast(x, root_rank=s.ranks[0],
                                        process_set=s)
                # Position-dependent weights: row i of the gather weighs
                # i + 1.
                weighted = tf.reduce_sum(
                    gathered * tf.range(1, k * 2 + 1, dtype=tf.float32))
            return (tape.gradient(weighted, x),
                    tape.gradient(summed, x),
                    tape.gradient(scattered, x),
                    tape.gradient(root, x))

        g_gather, g_sum, g_scatter, g_root = _run(
            grads, mode, tf.constant([1.0, 1.0]))
        # This rank's rows of the gather are 2 * me and 2 * me + 1.
        np.testing.assert_allclose(g_gather, [2 * me + 1, 2 * me + 2])
        np.testing.assert_allclose(g_sum, [k, k])
        # Reducescatter's gradient (Horovod's): allgather, times k for Sum.
        np.testing.assert_allclose(g_scatter, [k * k, k * k])
        np.testing.assert_allclose(
            g_root, [1.0, 1.0] if ME == s.ranks[0] else [0.0, 0.0])


# --- errors --------------------------------------------------------------


def _every_collective(s, root=0):
    x = tf.constant([1.0, 2.0])
    return {
        "allreduce": lambda: tfring.allreduce(x, process_set=s),
        "grouped_allreduce": lambda: tfring.grouped_allreduce(
            [x], process_set=s),
        "allgather": lambda: tfring.allgather(x, process_set=s),
        "grouped_allgather": lambda: tfring.grouped_allgather(
            [x], process_set=s),
        "broadcast": lambda: tfring.broadcast(x, root, process_set=s),
        "alltoall": lambda: tfring.alltoall(x, process_set=s),
        "reducescatter": lambda: tfring.reducescatter(x, process_set=s),
        "grouped_reducescatter": lambda: tfring.grouped_reducescatter(
            [x], process_set=s),
        "broadcast_variables": lambda: tfring.broadcast_variables(
            [tf.Variable(x)], root, process_set=s),
        "broadcast_object": lambda: tfring.broadcast_object(
            1, root, process_set=s),
        "allgather_object": lambda: tfring.allgather_object(
            1, process_set=s),
    }


def test_same_names_in_every_set_built_in_shuffled_order():
    # One name per kind, used in the global set and in each of this rank's
    # sets, built in a different random order on each rank in one function:
    # each set's copy of a name is its own tensor, matched by name.
    kinds = ("allreduce", "grouped_allreduce", "allgather", "broadcast")
    items = [(s, k, kind) for _, s in _all_sets()
             for k, kind in enumerate(kinds)]
    order = list(items)
    random.Random(ME).shuffle(order)

    def value(r, s, k):
        return float((r + 1) * (1 + k + 10 * s.process_set_id))

    def build(s, k, kind):
        x = tf.fill([2], value(ME, s, k))
        name = f"shuffled_{kind}"
        if kind == "allreduce":
            return tfring.allreduce(x, op=tfring.Sum, name=name,
                                    process_set=s)
        if kind == "grouped_allreduce":
            return tfring.grouped_allreduce([x, 2 * x], op=tfring.Sum,
                                            name=name, process_set=s)
        if kind == "allgather":
            return tfring.allgather(x[:1], name=name, process_set=s)
        return tfring.broadcast(x, s.ranks[-1], name=name, process_set=s)

    @tf.function
    def step():
        return {(s.process_set_id, kind): build(s, k, kind)
                for s, k, kind in order}

    results = within_time_limit(step)
    for s, k, kind in items:
        values = [value(r, s, k) for r in s.ranks]
        got = results[(s.process_set_id, kind)]
        if kind == "allreduce":
            want = [sum(values)] * 2
        elif kind == "grouped_allreduce":
            got = [g.numpy().tolist() for g in got]
            want = [[sum(values)] * 2, [2 * sum(values)] * 2]
        elif kind == "allgather":
            want = values
        else:
            want = [values[-1]] * 2
        np.testing.assert_array_equal(got, want, err_msg=f"{s} {kind}")


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("mode", MODES)
def test_collective_on_a_set_without_this_rank_is_refused(mode):
    assert _other_sets(), "every rank is outside some set from 2 ranks on"
    for _, s in _other_sets():
        for what, call in _every_collective(s, root=s.ranks[0]).items():
            if mode == "function" and what.endswith("_object"):
                continue  # needs values at once: eager only
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                _run(call, mode)
            message = str(info.value)
            assert f"called on rank {ME} with process_set={s}" in message, \
                what
            assert f"does not contain rank {ME}" in message
            assert "process_set.included()" in message


def test_unregistered_or_stale_set_is_a_value_error():
    never = tfring.ProcessSet([0])
    stale = tfring.ProcessSet([0])
    stale.process_set_id = 77
    for s, text in [(never, "which is not registered"),
                    (stale, "which does not exist in this job")]:
        for what, call in _every_collective(s).items():
            with pytest.raises(ValueError) as info:
                call()
            message = str(info.value)
            assert str(s) in message, what
            assert text in message, what
            assert "tfring.add_process_set()" in message
    v = tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = 2.0 * v
    with pytest.raises(ValueError, match="which is not registered"):
        tfring.DistributedGradientTape(tape, process_set=never).gradient(
            loss, [v])


def test_process_set_of_the_wrong_type():
    with pytest.raises(TypeError, match="Expected a tfring.ProcessSet"):
        tfring.allreduce(tf.constant(1.0), process_set=1)
    with pytest.raises(TypeError, match="Expected a tfring.ProcessSet"):
        tfring.DistributedGradientTape(tf.GradientTape(), process_set=[0])
    with pytest.raises(TypeError, match="Expected a tfring.ProcessSet"):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                       process_set=0)


@pytest.mark.requires_ranks(2)
def test_root_rank_outside_the_set():
    for _, s in _my_sets():
        outside = next(r for r in range(N) if r not in s.ranks)
        for what in ["broadcast", "broadcast_variables", "broadcast_object"]:
            with pytest.raises(ValueError) as info:
                _every_collective(s, root=outside)[what]()
            message = str(info.value)
            assert f"root_rank={outside}, which is not in {s}" in message
            assert f"Expected one of its ranks {s.ranks}" in message
            assert "not a position within the set" in message


@pytest.mark.requires_ranks(2)
def test_core_refuses_what_the_python_checks_would():
    # The low-level ops skip the Python checks; the core refuses on its own.
    x = tf.constant([1.0])
    with pytest.raises(tf.errors.InvalidArgumentError):
        ops.allreduce_op(x, tfring.Sum, process_set_id=77)
    for _, s in _other_sets():
        with pytest.raises(tf.errors.InvalidArgumentError):
            ops.allreduce_op(x, tfring.Sum, process_set_id=s.process_set_id)
    for _, s in _my_sets():
        outside = next(r for r in range(N) if r not in s.ranks)
        with pytest.raises(tf.errors.InvalidArgumentError):
            ops.broadcast_op(x, outside, process_set_id=s.process_set_id)
    # Nothing was left pending: the sets still work.
    for _, s in _my_sets():
        assert float(tfring.allreduce(x, op=tfring.Sum, process_set=s)[0]) \
            == len(s.ranks)


def test_add_and_remove_need_dynamic_sets():
    with pytest.raises(ValueError) as info:
        tfring.add_process_set([0])
    assert "initialized without dynamic process sets" in str(info.value)
    assert "tfring.init(process_sets='dynamic')" in str(info.value)
    for s in SETS.values():
        with pytest.raises(ValueError, match="without dynamic process sets"):
            tfring.remove_process_set(s)
    assert tfring.remove_process_set(tfring.global_process_set) is False
    assert tfring.remove_process_set(tfring.ProcessSet([0])) is False
    with pytest.raises(TypeError, match="Expected the tfring.ProcessSet"):
        tfring.remove_process_set([0])


def test_bad_init_arguments():
    duplicate = [tfring.ProcessSet([0]), tfring.ProcessSet([0])]
    cases = [
        ("static", ValueError, "Expected a list of tfring.ProcessSet or the "
         "string 'dynamic'"),
        ([[0]], TypeError, "Expected tfring.ProcessSet objects"),
        ([tfring.global_process_set], ValueError, "the global set always "
         "exists"),
        ([tfring.ProcessSet([N])], ValueError,
         rf"\[{N}\] are not ranks of the job"),
        ([tfring.ProcessSet([])], ValueError, "empty ProcessSet"),
        ([tfring.ProcessSet(list(range(N)))], ValueError,
         "the same ranks as the global set"),
    ]
    if N >= 2:
        cases.append((duplicate, ValueError,
                      r"entry 1 ProcessSet\(process_set_id=None, ranks=\[0\]\)"
                      r" with ranks \[0\], which an earlier entry already has"))
        # Lists that differ between ranks: every rank gets the same error.
        cases.append(([tfring.ProcessSet([ME % 2])], ValueError,
                      "different process_sets on different ranks"))
    _shutdown_together()
    try:
        for process_sets, error, text in cases:
            with pytest.raises(error, match=text):
                tfring.init(process_sets=process_sets)
            assert not tfring.is_initialized()
        with pytest.raises(ValueError) as info:
            tfring.mpi_ops._basics._get_process_set_ids_and_ranks()
        assert ("`tfring.mpi_ops._basics._get_process_set_ids_and_ranks()` "
                "was called after `tfring.shutdown()`") in str(info.value)
    finally:
        _init_module_sets()
    assert all(s.process_set_id is not None for s in SETS.values())
    assert all(s.process_set_id is None for s in duplicate)


# --- sets from communicators, dynamic sets --------------------------------


@pytest.mark.requires_ranks(2)
def test_process_set_from_a_split_communicator():
    parity = WORLD.Split(ME % 2, ME)
    # From 3 ranks: a communicator of ranks 0 and 1 only; the others pass
    # MPI.COMM_NULL and still learn which set it is.
    pair = WORLD.Split(0 if ME < 2 else MPI.UNDEFINED, ME)
    by_parity = tfring.ProcessSet(parity)
    assert by_parity.ranks is None and by_parity.included() is None
    process_sets = [by_parity]
    if N >= 3:
        by_pair = tfring.ProcessSet(pair)
        process_sets.append(by_pair)
    mine = [r for r in range(N) if r % 2 == ME % 2]
    try:
        with _initialized_with(process_sets):
            # Each rank's object is its own communicator's set; both
            # parities became sets (ids in sorted order of their ranks).
            assert by_parity.ranks == mine
            assert by_parity.included()
            table = tfring._core.process_sets()
            assert table[by_parity.process_set_id] == mine
            assert sorted(table[i] for i in (1, 2)) == [
                list(range(0, N, 2)), list(range(1, N, 2))]
            total = tfring.allreduce(tf.constant(float(ME)), op=tfring.Sum,
                                     process_set=by_parity)
            assert float(total) == sum(mine)
            if N >= 3:
                assert by_pair.ranks == [0, 1]
                assert by_pair.process_set_id == 3
                assert by_pair.included() == (ME < 2)
                if ME < 2:
                    out = tfring.allgather(tf.constant([ME]),
                                           process_set=by_pair)
                    assert list(out.numpy()) == [0, 1]
        # The same objects in a later job: looked up again.
        with _initialized_with(process_sets[::-1]):
            assert by_parity.ranks == mine
            assert tfring._core.process_sets()[
                by_parity.process_set_id] == mine
    finally:
        parity.Free()
        if pair != MPI.COMM_NULL:
            pair.Free()


@pytest.mark.requires_ranks(3)
def test_communicator_null_where_the_others_form_several_sets():
    # Ranks 0 and 1 get a communicator each ({0} and {1}); the last rank
    # gets MPI.COMM_NULL and cannot tell which set its object would be.
    ragged = WORLD.Split(ME % 2 if ME < N - 1 else MPI.UNDEFINED, ME)
    _shutdown_together()
    try:
        with pytest.raises(ValueError) as info:
            tfring.init(process_sets=[tfring.ProcessSet(ragged)])
        assert f"MPI.COMM_NULL on rank(s) [{N - 1}]" in str(info.value)
        assert "Give every rank a color in comm.Split()" in str(info.value)
        assert not tfring.is_initialized()
    finally:
        _init_module_sets()
        if ragged != MPI.COMM_NULL:
            ragged.Free()


def test_dynamic_sets_add_use_remove():
    with _initialized_with("dynamic"):
        assert set(tfring._core.process_sets()) == {0}
        with pytest.raises(ValueError) as info:
            tfring.add_process_set(list(range(N)))
        assert "a duplicate of the existing process set 0" in str(info.value)
        with pytest.raises(ValueError, match="not ranks of the job"):
            tfring.add_process_set([N])
        if N == 1:
            return
        comm = WORLD.Dup()
        with pytest.raises(NotImplementedError, match="list of job ranks"):
            tfring.add_process_set(tfring.ProcessSet(comm))
        comm.Free()
        # Ranks that pass different sets: every rank fails, the job goes on.
        with pytest.raises(ValueError) as info:
            tfring.add_process_set([ME % 2])
        assert "the ranks passed different process sets" in str(info.value)
        assert set(tfring._core.process_sets()) == {0}
        first = tfring.add_process_set([0])             # a list of ranks
        second = tfring.add_process_set(tfring.ProcessSet([N - 1, 0])) \
            if N >= 3 else tfring.add_process_set(tfring.ProcessSet([1]))
        assert isinstance(first, tfring.ProcessSet)
        assert first.process_set_id >= 1
        assert second.process_set_id > first.process_set_id
        assert tfring._core.process_sets()[second.process_set_id] == \
            second.ranks
        assert tfring.mpi_ops._basics._get_process_set_ids_and_ranks() == {
            0: list(range(N)), first.process_set_id: [0],
            second.process_set_id: second.ranks}
        with pytest.raises(ValueError) as info:
            tfring.add_process_set([0])
        assert (f"a duplicate of the existing process set "
                f"{first.process_set_id}") in str(info.value)
        for s in (first, second):
            if s.included():
                out = tfring.allreduce(tf.constant([float(ME)]),
                                       op=tfring.Sum, process_set=s)
                assert float(out[0]) == sum(s.ranks)
        removed_id = first.process_set_id
        assert tfring.remove_process_set(first) is True
        assert first.process_set_id is None
        assert removed_id not in tfring._core.process_sets()
        assert tfring.remove_process_set(first) is False
        assert tfring.remove_process_set(tfring.global_process_set) is False
        with pytest.raises(ValueError) as info:
            tfring.allreduce(tf.constant(1.0), process_set=first)
        assert "which is not registered" in str(info.value)
        assert str(first) in str(info.value)
        # A stale copy of the removed set's id.
        copy = tfring.ProcessSet([0])
        copy.process_set_id = removed_id
        with pytest.raises(ValueError, match="does not exist in this job"):
            tfring.allgather(tf.constant([1]), process_set=copy)
        # Ids are never reused; the other set keeps working.
        again = tfring.add_process_set([0])
        assert again.process_set_id > second.process_set_id
        for s in (again, second):
            if s.included():
                out = tfring.allgather(tf.constant([ME]), process_set=s)
                assert list(out.numpy()) == s.ranks
        assert tfring.remove_process_set(second) is True
        assert tfring.remove_process_set(again) is True
        assert set(tfring._core.process_sets()) == {0}
        assert tfring.mpi_ops._basics._get_process_set_ids_and_ranks() == {
            0: list(range(N))}


# --- Keras -----------------------------------------------------------------


@pytest.mark.requires_ranks(2)
def test_keras_fit_with_distributed_optimizer_in_a_set():
    lower, upper = SETS["lower"], SETS["upper"]
    s = lower if ME in lower.ranks else upper
    k = len(s.ranks)
    lr = 0.1
    # y = x . w, one full-batch step per epoch; rank r's data depends on r.
    x = np.full([4, 2], ME + 1, dtype=np.float32)
    y = np.full([4, 1], 1.0, dtype=np.float32)
    model = keras.Sequential([keras.Input((2,)),
                              keras.layers.Dense(1, use_bias=False)])
    # Different starting weights per rank: the callback broadcasts the
    # set's first rank's.
    model.set_weights([np.full([2, 1], 0.01 * ME, dtype=np.float32)])
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(lr),
                                         process_set=s)
    assert opt.process_set is s
    model.compile(optimizer=opt, loss="mse")
    callbacks = [
        hvd_keras.callbacks.MetricAverageCallback(process_set=s),
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(
            s.ranks[0], process_set=s),
    ]
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                        verbose=0, callbacks=callbacks)
    # The same trajectory, in NumPy: the gradient of mean((x.w - 1)^2) is
    # 2 * c * (2 * c * w - 1) per weight for x == c, averaged over the set.
    w = 0.01 * s.ranks[0]
    losses = []
    for _ in range(2):
        local = [(2 * (r + 1) * w - 1) ** 2 for r in s.ranks]
        losses.append(np.mean(local))
        grad = np.mean([2 * (r + 1) * (2 * (r + 1) * w - 1)
                        for r in s.ranks])
        w = w - lr * grad
    np.testing.assert_allclose(model.get_weights()[0], np.full([2, 1], w),
                               rtol=1e-5)
    # MetricAverageCallback averaged the loss over the set only.
    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-5)
    gathered = tfring.allgather(tf.constant(model.get_weights()[0].T),
                                process_set=s)
    np.testing.assert_array_equal(gathered, np.tile(gathered[:1], [k, 1]))


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss_scale", [False, True])
def test_distributed_optimizer_outside_the_set_applies_own_gradients(
        mode, loss_scale):
    # As Horovod's Keras optimizer: the set's ranks apply the set's average,
    # the others their own gradients (here with a local variable too, which
    # the loss-scale optimizer checks for overflow within the set only).
    for _, s in SETS.items():
        k = len(s.ranks)
        w = tf.Variable([1.0, 1.0])
        local = tf.Variable([1.0])
        inner = keras.optimizers.SGD(1.0)
        if loss_scale:
            inner = keras.optimizers.LossScaleOptimizer(inner,
                                                        initial_scale=1.0)
        opt = hvd_keras.DistributedOptimizer(inner, process_set=s)
        opt.register_local_var(local)
        opt.build([w, local])
        grads = [tf.constant([float(ME), 1.0]), tf.constant([float(ME)])]
        _run(lambda: opt.apply(grads, [w, local]), mode)
        if ME in s.ranks:
            np.testing.assert_allclose(w, [1.0 - np.mean(s.ranks), 0.0])
        else:
            np.testing.assert_allclose(w, [1.0 - ME, 0.0])
        np.testing.assert_allclose(local, [1.0 - ME / k], rtol=1e-6)


# --- two disjoint sets at once ------------------------------------------


def _interleaved_step(i, lower, upper):
    """One step: the lower set and the upper set run different collectives,
    with global ones in between. `i` is a Python int or an int32 tensor."""
    fi, ii = tf.cast(i, tf.float32), tf.cast(i, tf.int32)
    x = tf.fill([3], float(ME) + fi)
    results = {}
    results["global_a"] = tfring.allreduce(x, op=tfring.Sum)
    if ME in lower.ranks:
        results["lower_sum"] = tfring.allreduce(x, op=tfring.Sum,
                                                process_set=lower)
        results["lower_gather"] = tfring.allgather(
            tf.fill([ME + 1], ME + ii), process_set=lower)
        results["lower_bcast"] = tfring.broadcast(
            x, root_rank=lower.ranks[-1], process_set=lower)
    else:
        results["upper_avg"] = tfring.allreduce(x, op=tfring.Average,
                                                process_set=upper)
        results["upper_scatter"] = tfring.reducescatter(
            tf.fill([2 * len(upper.ranks), 2], float(ME) + fi),
            op=tfring.Sum, process_set=upper)
    results["global_b"] = tfring.allgather(tf.reshape(ME + ii, [1]))
    if ME in upper.ranks:
        results["upper_a2a"] = tfring.alltoall(
            tf.fill([len(upper.ranks)], ME * 10 + ii), process_set=upper)
    results["global_c"] = tfring.broadcast(tf.reshape(float(ME) + fi, [1]),
                                           root_rank=0)
    return results


def _check_interleaved(i, results, lower, upper):
    everyone = list(range(N))
    np.testing.assert_array_equal(results["global_a"],
                                  [sum(everyone) + N * i] * 3)
    np.testing.assert_array_equal(results["global_b"],
                                  [r + i for r in everyone])
    np.testing.assert_array_equal(results["global_c"], [i])
    if ME in lower.ranks:
        ranks = lower.ranks
        np.testing.assert_array_equal(
            results["lower_sum"], [sum(ranks) + len(ranks) * i] * 3)
        np.testing.assert_array_equal(
            results["lower_gather"],
            np.concatenate([np.full([r + 1], r + i) for r in ranks]))
        np.testing.assert_array_equal(results["lower_bcast"],
                                      [ranks[-1] + i] * 3)
    else:
        ranks = upper.ranks
        np.testing.assert_allclose(results["upper_avg"],
                                   [np.mean(ranks) + i] * 3)
        np.testing.assert_array_equal(
            results["upper_scatter"],
            np.full([2, 2], sum(ranks) + len(ranks) * i))
        np.testing.assert_array_equal(results["upper_a2a"],
                                      [r * 10 + i for r in ranks])


@pytest.mark.requires_ranks(4)
@pytest.mark.parametrize("mode", MODES)
def test_disjoint_sets_run_different_collectives_concurrently(mode):
    lower, upper = SETS["lower"], SETS["upper"]
    assert not set(lower.ranks) & set(upper.ranks)
    step = tf.function(lambda i: _interleaved_step(i, lower, upper)) \
        if mode == "function" else None
    for i in range(40):
        if mode == "eager":
            results = _interleaved_step(i, lower, upper)
        else:
            results = step(tf.constant(i))
        _check_interleaved(i, results, lower, upper)


@pytest.mark.requires_ranks(4)
def test_disjoint_sets_with_grouped_calls_and_tapes():
    lower, upper = SETS["lower"], SETS["upper"]
    mine = lower if ME in lower.ranks else upper
    w = tf.Variable([1.0, 1.0])

    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * x)
        tape = tfring.DistributedGradientTape(tape, process_set=mine)
        grad = tape.gradient(loss, [w])[0]
        everyone = tfring.allreduce(grad, op=tfring.Sum)
        return grad, everyone

    for i in range(20):
        x = tf.constant([float(ME + i), 1.0])
        grouped = tfring.grouped_allreduce(
            [x, 2 * x], op=tfring.Sum, process_set=mine)
        np.testing.assert_array_equal(
            grouped[0], [sum(mine.ranks) + len(mine.ranks) * i,
                         len(mine.ranks)])
        grad, everyone = train_step(x)
        np.testing.assert_allclose(grad, [np.mean(mine.ranks) + i, 1.0])
        set_means = {tuple(lower.ranks): np.mean(lower.ranks) + i,
                     tuple(upper.ranks): np.mean(upper.ranks) + i}
        expected = sum(set_means[tuple(lower.ranks)] for _ in lower.ranks) \
            + sum(set_means[tuple(upper.ranks)] for _ in upper.ranks)
        np.testing.assert_allclose(everyone, [expected, N], rtol=1e-6)
