# Collectives named by the user are matched across ranks by that name,
# whatever order each rank builds them in: every collective kind, each with
# an explicit name, built in a different random order on each rank (the
# shuffle is seeded with the rank) inside one tf.function, inside tf.cond
# and tf.while_loop bodies, with their gradients, eagerly (one thread per
# collective, started in the shuffled order) and in a tf.compat.v1.Graph
# run by a Session; copies of one name in one function; and the naming
# function itself.
#
# Why: real programs build collectives in a rank-dependent order without
# meaning to (iterating a set of names, whose string hashes are randomised
# per process; a dict filled from a directory listing). A name that carried
# the collective's position among all of the function's collectives would
# differ between ranks, and every rank would wait forever. Each graph test
# first compares the names across ranks (a mismatch fails at once instead of
# hanging), then runs the collectives under a time limit and checks every
# value: values differ per collective, so a wrong pairing shows.

import random
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import tfring
from tfring import ops
from tfring.ops import collective_ops
from time_limit import DEFAULT_SECONDS, within_time_limit

KINDS = ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather",
         "broadcast", "alltoall", "reducescatter", "grouped_reducescatter")
# Two collectives of each kind, so a per-kind count could not match them
# either. (index, kind, name); the index makes every collective's values
# its own.
ITEMS = tuple((2 * i + j, kind, f"{kind}_{j}")
              for i, kind in enumerate(KINDS) for j in range(2))
# The kinds with a gradient, for the differentiated case.
DIFFERENTIABLE = tuple(item for item in ITEMS
                       if not item[1].startswith("grouped_"))
COLLECTIVE_TYPES = ("Tfring>Allreduce", "Tfring>Allgather",
                    "Tfring>Broadcast", "Tfring>Alltoall",
                    "Tfring>Reducescatter")
TIME_LIMIT_SECONDS = DEFAULT_SECONDS


def _shuffled(items, rank):
    order = list(items)
    random.Random(rank).shuffle(order)
    return order


def test_the_shuffles_differ_between_ranks(size):
    orders = {tuple(_shuffled(ITEMS, r)) for r in range(size)}
    assert len(orders) == size


def _values(index, kind, r, size):
    """Rank r's input of collective `index`, as numpy (a list for grouped
    kinds)."""
    b = float((index + 1) * (r + 1))
    rows = np.arange(size, dtype=np.float32)
    if kind == "allreduce":
        return np.full([3], b, np.float32)
    if kind == "grouped_allreduce":
        return [np.full([2], b, np.float32), np.full([4], -2 * b, np.float32)]
    if kind == "allgather":
        return np.full([r + 1, 2], b, np.float32)
    if kind == "grouped_allgather":
        return [np.full([1], b, np.float32), np.full([r + 1], -b, np.float32)]
    if kind == "broadcast":
        return np.full([2], b, np.float32)
    if kind == "alltoall":
        return np.stack([10 * b + rows, -10 * b - rows], axis=1)
    if kind == "reducescatter":
        return b + np.arange(2 * size, dtype=np.float32)
    if kind == "grouped_reducescatter":
        return [b + rows, np.stack([b + 2 * rows, b - rows] * 2, axis=1)
                .reshape([2 * size, 2])]
    raise ValueError(kind)


def _inputs(index, kind, rank, size):
    return tf.nest.map_structure(tf.constant,
                                 _values(index, kind, rank, size))


def _expected(index, kind, rank, size):
    every = [_values(index, kind, r, size) for r in range(size)]
    if kind in ("allreduce", "grouped_allreduce"):
        return tf.nest.map_structure(lambda *v: np.sum(v, axis=0), *every)
    if kind in ("allgather", "grouped_allgather"):
        return tf.nest.map_structure(lambda *v: np.concatenate(v), *every)
    if kind == "broadcast":
        return every[size - 1]
    if kind == "alltoall":
        return np.concatenate([v[rank:rank + 1] for v in every])
    if kind in ("reducescatter", "grouped_reducescatter"):
        def block(*v):
            total = np.sum(v, axis=0)
            rows = total.shape[0] // size
            return total[rank * rows:(rank + 1) * rows]
        return tf.nest.map_structure(block, *every)
    raise ValueError(kind)


def _build(kind, name, x, size):
    if kind == "allreduce":
        return tfring.allreduce(x, op=tfring.Sum, name=name)
    if kind == "grouped_allreduce":
        return tfring.grouped_allreduce(x, op=tfring.Sum, name=name)
    if kind == "allgather":
        return tfring.allgather(x, name=name)
    if kind == "grouped_allgather":
        return tfring.grouped_allgather(x, name=name)
    if kind == "broadcast":
        return tfring.broadcast(x, size - 1, name=name)
    if kind == "alltoall":
        return tfring.alltoall(x, name=name)
    if kind == "reducescatter":
        return tfring.reducescatter(x, op=tfring.Sum, name=name)
    if kind == "grouped_reducescatter":
        return tfring.grouped_reducescatter(x, op=tfring.Sum, name=name)
    raise ValueError(kind)


def _build_shuffled(rank, size):
    """Every item, built in this rank's order; {name: result}."""
    return {name: _build(kind, name, _inputs(index, kind, rank, size), size)
            for index, kind, name in _shuffled(ITEMS, rank)}


def _check_results(results, rank, size):
    for index, kind, name in ITEMS:
        got = tf.nest.map_structure(np.asarray, results[name])
        want = _expected(index, kind, rank, size)
        tf.nest.assert_same_structure(got, want)
        for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
            np.testing.assert_array_equal(g, w, err_msg=name)


def _collective_names(graph_def):
    """The cross-rank names of every collective in `graph_def`, including
    its function library (cond branches, loop bodies, helpers)."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return sorted(node.attr["tensor_name"].s.decode() for node in nodes
                  if node.op in COLLECTIVE_TYPES)


def _assert_same_names_on_every_rank(graph):
    names = _collective_names(graph.as_graph_def())
    assert names and len(set(names)) == len(names), names
    gathered = tfring.allgather_object(names)
    for r, theirs in enumerate(gathered):
        assert theirs == names, (
            f"rank {r} named its collectives differently: "
            f"{sorted(set(theirs) ^ set(names))}")
    return names


def test_shuffled_named_collectives_in_a_function(rank, size):
    @tf.function
    def shuffled_step():
        return _build_shuffled(rank, size)

    concrete = shuffled_step.get_concrete_function()
    names = _assert_same_names_on_every_rank(concrete.graph)
    # A user's name is its key, qualified by the function and numbered for
    # no one: each name is used once.
    assert "shuffled_step/allreduce_0" in names
    assert "shuffled_step/grouped_allreduce_1.1" in names
    for _ in range(2):
        _check_results(within_time_limit(shuffled_step), rank, size)


def test_shuffled_named_collectives_in_a_cond(rank, size):
    @tf.function
    def cond_step(predicate):
        def local():
            return {name: tf.nest.map_structure(
                tf.identity, _inputs(index, kind, rank, size))
                for index, kind, name in ITEMS}

        return tf.cond(predicate, lambda: _build_shuffled(rank, size), local)

    concrete = cond_step.get_concrete_function(tf.constant(True))
    _assert_same_names_on_every_rank(concrete.graph)
    _check_results(within_time_limit(cond_step, tf.constant(True)), rank,
                   size)


def _item_sums(results):
    """The sum of each item's results, in ITEMS order."""
    return tf.stack([tf.add_n([tf.reduce_sum(t) for t in
                               tf.nest.flatten(results[name])])
                     for _, _, name in ITEMS])


def test_shuffled_named_collectives_in_a_while_loop(rank, size):
    iterations = 2

    @tf.function
    def loop_step():
        def body(i, sums):
            return i + 1, sums + _item_sums(_build_shuffled(rank, size))

        return tf.while_loop(
            lambda i, sums: i < iterations, body,
            [tf.constant(0), tf.zeros([len(ITEMS)])],
            parallel_iterations=1)[1]

    _assert_same_names_on_every_rank(loop_step.get_concrete_function().graph)
    want = [iterations * sum(np.sum(e) for e in tf.nest.flatten(
        _expected(index, kind, rank, size))) for index, kind, _ in ITEMS]
    np.testing.assert_array_equal(within_time_limit(loop_step).numpy(),
                                  want)


def test_gradients_of_shuffled_named_collectives(rank, size):
    # The gradients' own collectives are named after their forward ops, so
    # they too match whatever order the tape meets them in.
    @tf.function
    def gradient_step():
        inputs = {name: _inputs(index, kind, rank, size)
                  for index, kind, name in DIFFERENTIABLE}
        with tf.GradientTape() as tape:
            tape.watch(list(inputs.values()))
            loss = 0.0
            for index, kind, name in _shuffled(DIFFERENTIABLE, rank):
                result = _build(kind, name, inputs[name], size)
                loss += (index + 1.0) * tf.reduce_sum(result)
        return tape.gradient(loss, inputs)

    names = _assert_same_names_on_every_rank(
        gradient_step.get_concrete_function().graph)
    assert "gradient_step/allreduce_0_grad" in names
    assert "gradient_step/allgather_1_grad_rows" in names
    grads = within_time_limit(gradient_step)
    for index, kind, name in DIFFERENTIABLE:
        c = index + 1.0
        if kind in ("allreduce", "reducescatter"):
            want = c * size
        elif kind == "broadcast":
            want = c if rank == size - 1 else 0.0
        else:  # allgather, alltoall: the ranks' incoming gradients, averaged
            want = c
        got = grads[name].numpy()
        np.testing.assert_array_equal(got, np.full(got.shape, want),
                                      err_msg=name)


def test_shuffled_named_collectives_eagerly(rank, size):
    # Eager collectives block their thread until every rank has submitted
    # them, so each runs in its own thread; the threads start in this
    # rank's order.
    results, errors = {}, []

    def run(index, kind, name):
        try:
            results[name] = tf.nest.map_structure(
                lambda t: t.numpy(),
                _build(kind, name, _inputs(index, kind, rank, size), size))
        except Exception as error:  # reported below, on this rank
            errors.append(f"{name}: {error}")

    threads = []
    for item in _shuffled(ITEMS, rank):
        threads.append(threading.Thread(target=run, args=item, daemon=True))
        threads[-1].start()
        time.sleep(0.02)
    deadline = time.monotonic() + TIME_LIMIT_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), (
        "eager collectives still waiting: the ranks did not pair them up")
    assert not errors, errors
    _check_results(results, rank, size)


def test_shuffled_named_collectives_in_a_compat_v1_graph(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        results = _build_shuffled(rank, size)
    names = _assert_same_names_on_every_rank(graph)
    # No function: the user's names as they are.
    assert "allreduce_0" in names and "grouped_allgather_1.0" in names
    with tf.compat.v1.Session(graph=graph) as session:
        for _ in range(2):
            _check_results(within_time_limit(session.run, results), rank,
                           size)


def test_copies_of_one_name_in_one_function(rank, size):
    # The same name twice (as a library that names every call alike does):
    # the copies are numbered in the order they are built, which is the
    # same on every rank here.
    @tf.function
    def copies_step():
        first = tfring.allreduce(tf.constant([1.0 + rank]), op=tfring.Sum,
                                 name="dup")
        second = tfring.allreduce(tf.constant([10.0 * (rank + 1)]),
                                  op=tfring.Sum, name="dup")
        groups = [tfring.grouped_allreduce(
            [tf.constant([scale * (rank + 1)]), tf.constant([-scale])],
            op=tfring.Sum, name="dup_group") for scale in (100.0, 1000.0)]
        return first, second, groups

    names = _assert_same_names_on_every_rank(
        copies_step.get_concrete_function().graph)
    assert names == ["copies_step/dup", "copies_step/dup@1",
                     "copies_step/dup_group.0", "copies_step/dup_group.0@1",
                     "copies_step/dup_group.1", "copies_step/dup_group.1@1"]
    first, second, groups = within_time_limit(copies_step)
    total = size * (size + 1) / 2.0
    assert first.numpy().tolist() == [total]
    assert second.numpy().tolist() == [10.0 * total]
    assert [[t.numpy().tolist() for t in g] for g in groups] == [
        [[100.0 * total], [-100.0 * size]],
        [[1000.0 * total], [-1000.0 * size]]]


def test_copies_of_one_name_in_a_compat_v1_graph(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([1.0 + rank])
        results = [tfring.allreduce(scale * x, op=tfring.Sum, name="dup")
                   for scale in (1.0, 10.0, 100.0)]
    assert _collective_names(graph.as_graph_def()) == ["dup", "dup@1",
                                                       "dup@2"]
    with tf.compat.v1.Session(graph=graph) as session:
        got = within_time_limit(session.run, results)
    total = size * (size + 1) / 2.0
    assert [g.tolist() for g in got] == [[total], [10.0 * total],
                                         [100.0 * total]]


@pytest.mark.parametrize("kind, name, process_set_id, occurrence, label", [
    ("allreduce", "grad_w", 0, 0, "grad_w"),
    ("allreduce", "grad_w", 0, 2, "grad_w@2"),
    ("allgather", "grad_w", 3, 0, "grad_w.ps3"),
    ("allgather", "grad_w", 3, 1, "grad_w.ps3@1"),
    ("allreduce", None, 0, 0, "allreduce.0"),
    ("broadcast", "", 0, 4, "broadcast.4"),
    ("alltoall", None, 2, 1, "alltoall.ps2.1"),
])
def test_collective_label(kind, name, process_set_id, occurrence, label):
    assert collective_ops.collective_label(
        kind, name, process_set_id, occurrence) == label


def test_graph_tensor_names_count_each_name_apart():
    graph = tf.Graph()
    built = [(kind, name, ps) for kind, name, ps in [
        ("allreduce", "b", 0), ("allreduce", None, 0), ("allgather", "a", 0),
        ("allreduce", "b", 1), ("allreduce", "a", 0), ("allgather", None, 0),
        ("allreduce", None, 0), ("allreduce", "b", 0), ("allreduce", None, 1)]]
    names = [collective_ops._graph_tensor_name(graph, kind, name, ps)
             for kind, name, ps in built]
    assert names == ["b", "allreduce.0", "a", "b.ps1", "a@1", "allgather.0",
                     "allreduce.1", "b@1", "allreduce.ps1.0"]


def test_gradient_names_come_from_the_forward_names():
    # Built only: process set 3 need not exist.
    def build():
        x = tf.constant([1.0])
        named = ops.allreduce_op(x, tfring.Sum, name="w", process_set_id=3)
        copy = ops.allreduce_op(x, tfring.Sum, name="w", process_set_id=3)
        unnamed = ops.allreduce_op(x, tfring.Sum)
        return tf.gradients(named + copy + unnamed, x)

    graph = tf.Graph()
    with graph.as_default():
        build()
    assert _collective_names(graph.as_graph_def()) == [
        "allreduce.0", "allreduce.0_grad", "w.ps3", "w.ps3@1",
        "w@1_grad.ps3", "w_grad.ps3"]
    function_graph = tf.function(build).get_concrete_function().graph
    assert _collective_names(function_graph.as_graph_def()) == [
        "build/allreduce.0", "build/allreduce.0_grad", "build/w.ps3",
        "build/w.ps3@1", "build/w@1_grad.ps3", "build/w_grad.ps3"]
