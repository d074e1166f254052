# The ops in graphs: a tf.compat.v1 Session, and the naming rule of
# tfring.ops.collective_ops (the name the kernel gives the core must be equal
# on every rank and unique among concurrently running tensors): the
# function's name and the collective's name (or, unnamed, its number among
# the unnamed collectives of its kind), names that the kernel really uses,
# two functions with identical bodies running at the same time in two
# threads, a helper function shared by two functions running at the same
# time, a helper called many times under a name scope opened on one rank
# only, a name scope opened on one rank only, control flow, nested
# functions, and names that do not depend on how many functions a rank
# traced before; a collective of a constant, which constant folding must not
# evaluate at optimization time. Named collectives built in a different order
# on each rank are in test_collective_names.py.

import json
import os
import tempfile
import threading

import numpy as np
import pytest
import tensorflow as tf

import tfring
from tfring import ops


def _tensor_names(graph):
    """The cross-rank names of the collectives in `graph`, as built."""
    return sorted(op.get_attr("tensor_name").decode()
                  for op in graph.get_operations()
                  if op.type.startswith("Tfring>") and "tensor_name" in
                  op.node_def.attr)


def test_compat_v1_session(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        summed = ops.allreduce_op(x, tfring.Sum)
        gathered = ops.allgather_op(x)
        shared = ops.broadcast_op(x, size - 1)
        topology = [ops.size_op(), ops.rank_op()]
        (grad,) = tf.gradients(tf.reduce_sum(summed * 2.0), x)
        # No function: unnamed collectives are numbered per kind; the
        # gradient's allreduce is named after its forward op.
        assert _tensor_names(graph) == [
            "allgather.0", "allreduce.0", "allreduce.0_grad", "broadcast.0"]
    with tf.compat.v1.Session(graph=graph) as session:
        for step in range(2):
            feed = {x: np.array([rank + step, 1.0], np.float32)}
            s, g, b, t, d = session.run(
                [summed, gathered, shared, topology, grad], feed_dict=feed)
            ranks = np.arange(size, dtype=np.float32)
            np.testing.assert_array_equal(
                s, [ranks.sum() + size * step, size])
            np.testing.assert_array_equal(
                g, np.stack([ranks + step, np.ones(size)], 1).reshape(-1))
            np.testing.assert_array_equal(b, [size - 1 + step, 1.0])
            assert t == [size, rank]
            np.testing.assert_array_equal(d, [2.0 * size] * 2)


def test_compat_v1_session_names_and_v1_gradients(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([1.0 + rank])
        first = ops.allreduce_op(x, tfring.Average, name="loss")
        second = ops.allreduce_op(x, tfring.Average, name="loss")
        (grad,) = tf.gradients(first + second, x)
        assert (first.op.name, second.op.name) == ("loss", "loss_1")
        assert (first.op.get_attr("tensor_name"),
                second.op.get_attr("tensor_name")) == (b"loss", b"loss@1")
    with tf.compat.v1.Session(graph=graph) as session:
        f, s, g = session.run([first, second, grad])
    mean = (size + 1) / 2.0
    assert f.tolist() == [mean] and s.tolist() == [mean]
    assert g.tolist() == [2.0]


def test_compat_v1_conds_count_in_their_graph(rank, size):
    # Branch graphs of two conds in one v1 graph both carry the name
    # `cond_true`: their collectives are numbered in the enclosing graph, so
    # the two allreduces (run concurrently by the session) stay apart.
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([1.0 + rank])
        first = tf.cond(x[0] > 0.0, lambda: ops.allreduce_op(x, tfring.Sum),
                        lambda: x)
        second = tf.cond(x[0] > 0.0,
                         lambda: ops.allreduce_op(10.0 * x, tfring.Sum),
                         lambda: x)
    with tf.compat.v1.Session(graph=graph) as session:
        f, s = session.run([first, second])
    total = size * (size + 1) / 2.0
    assert (f.tolist(), s.tolist()) == ([total], [10.0 * total])


def test_function_collectives_are_named_by_function_and_name():
    x = tf.constant([1.0])

    @tf.function
    def train_step():
        with tf.name_scope("dense"):
            a = ops.allreduce_op(x, tfring.Sum)
        b = ops.allreduce_op(x, tfring.Sum, name="loss")
        return a + b + ops.allgather_op(x) + ops.broadcast_op(x, 0)

    graph = train_step.get_concrete_function().graph
    assert _tensor_names(graph) == ["train_step/allgather.0",
                                    "train_step/allreduce.0",
                                    "train_step/broadcast.0",
                                    "train_step/loss"]


def test_lambda_function_name_is_sanitized(size):
    x = tf.constant([1.0])
    run = tf.function(lambda: ops.allreduce_op(x, tfring.Sum))
    assert _tensor_names(run.get_concrete_function().graph) == [
        "lambda_/allreduce.0"]
    assert run().numpy().tolist() == [float(size)]


def test_kernel_uses_the_function_qualified_name(size):
    # The broadcast kernel names its tensor in the root_rank error, which it
    # raises before anything reaches the core.
    x = tf.constant([1.0])

    @tf.function
    def first_step():
        return ops.broadcast_op(x, size)

    @tf.function
    def second_step():
        return ops.broadcast_op(x, size)

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="tensor 'first_step/broadcast.0'"):
        first_step()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="tensor 'second_step/broadcast.0'"):
        second_step()
    # Eagerly the name is the `name` argument.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="tensor 'eager_weights'"):
        ops.broadcast_op(x, size, name="eager_weights")


def test_two_functions_run_concurrently(rank, size):
    # Identical bodies, so identical names but for the function. Without it
    # one name would be in flight twice on a rank.
    x = tf.constant([1.0 + rank])

    @tf.function
    def first_step():
        return ops.allreduce_op(x, tfring.Sum)

    @tf.function
    def second_step():
        return ops.allreduce_op(x, tfring.Sum) * 2.0

    expected = size * (size + 1) / 2.0
    results = _run_concurrently(
        [("first", first_step), ("second", second_step)], iterations=25)
    assert results["first"] == [[expected]] * 25
    assert results["second"] == [[2.0 * expected]] * 25


def _run_concurrently(functions, iterations):
    """Runs each (label, fn) in its own thread `iterations` times, started
    together; returns {label: [result, ...]}."""
    results = {label: [] for label, _ in functions}
    failures = []
    start = threading.Barrier(len(functions))

    def loop(label, fn):
        try:
            start.wait()
            for _ in range(iterations):
                results[label].append(fn().numpy().tolist())
        except Exception as e:  # reported by the main thread
            failures.append(e)

    threads = [threading.Thread(target=loop, args=item) for item in functions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    return results


def test_shared_helper_in_two_functions_run_concurrently(rank, size):
    # TensorFlow inlines `helper` into both callers, so both contain the
    # collective traced once in helper. Each caller's copy must be its own
    # tensor: f's ones are never reduced with g's hundreds.
    @tf.function
    def helper(x):
        return ops.allreduce_op(x, tfring.Sum)

    @tf.function
    def f():
        return helper(tf.ones([3]))

    @tf.function
    def g():
        return helper(100.0 * tf.ones([3]))

    # Odd ranks start the other function first.
    functions = [("f", f), ("g", g)]
    if rank % 2:
        functions.reverse()
    results = _run_concurrently(functions, iterations=20)
    assert results["f"] == [[float(size)] * 3] * 20
    assert results["g"] == [[100.0 * size] * 3] * 20


def test_helper_called_twice_in_one_function(rank, size):
    @tf.function
    def helper(x):
        return ops.allreduce_op(x, tfring.Sum)

    @tf.function
    def step():
        return tf.stack([helper(tf.constant(1.0 + rank)),
                         helper(tf.constant(10.0 * (rank + 1)))])

    total = size * (size + 1) / 2.0
    assert step().numpy().tolist() == [total, 10.0 * total]


def test_helper_called_many_times_under_a_scope_opened_on_one_rank(rank,
                                                                   size):
    # The inlined copies of the helper's collective are named after their
    # call sites: `call_1/...` to `call_12/...` on rank 0, which opened one
    # more `call` scope first, `call/...` to `call_11/...` elsewhere. Copy
    # numbers follow the calls only if `call_10` sorts after `call_9`.
    @tf.function
    def helper(x):
        return ops.allreduce_op(x, tfring.Sum)

    @tf.function
    def step():
        if rank == 0:
            with tf.name_scope("call"):
                tf.constant(0.0, name="summary")
        results = []
        for k in range(12):
            with tf.name_scope("call"):
                x = tf.constant(float((k + 1) * (rank + 1)))
                results.append(helper(x))
        return tf.stack(results)

    total = size * (size + 1) / 2.0
    assert step().numpy().tolist() == [(k + 1) * total for k in range(12)]


def test_name_scope_opened_on_one_rank_only(rank, size):
    # A summary written by rank 0 alone opens a name scope there, so every
    # later scope of the same name is numbered differently on rank 0
    # ("reduce_1" against "reduce"): node names differ across ranks, the
    # collective's name must not.
    @tf.function
    def step(x):
        if rank == 0:
            with tf.name_scope("reduce"):
                tf.identity(x, name="summary")
        with tf.name_scope("reduce"):
            return ops.allreduce_op(x, tfring.Sum)

    assert step(tf.constant([1.0])).numpy().tolist() == [float(size)]


def test_cond_and_while_loop_in_a_function(rank, size):
    @tf.function
    def loop_step(x):
        x = tf.cond(x[0] >= 0.0,
                    lambda: ops.allreduce_op(x, tfring.Max),
                    lambda: x)

        def body(i, acc):
            return i + 1, ops.allreduce_op(acc, tfring.Sum) / float(size)

        _, x = tf.while_loop(lambda i, acc: i < 3, body,
                             [tf.constant(0), x], parallel_iterations=1)
        return x

    result = loop_step(tf.constant([float(rank), 2.0]))
    assert result.numpy().tolist() == [size - 1.0, 2.0]


def test_nested_functions(rank, size):
    @tf.function
    def inner(x):
        return ops.allreduce_op(x, tfring.Sum)

    @tf.function
    def outer(x):
        return inner(x) + ops.allreduce_op(x, tfring.Sum)

    result = outer(tf.constant([1.0 + rank]))
    assert result.numpy().tolist() == [size * (size + 1.0)]


def test_names_do_not_depend_on_tracing_history(rank, size):
    # Graph-name counters differ between ranks once one rank traces more
    # functions; collective names must not contain them.
    if rank == 0:
        for k in range(3):
            tf.function(lambda: tf.while_loop(
                lambda i: i < k, lambda i: i + 1, [0]))()

    @tf.function
    def step(x):
        return tf.while_loop(
            lambda i, acc: i < 2,
            lambda i, acc: (i + 1, ops.allreduce_op(acc, tfring.Max)),
            [tf.constant(0), x])[1]

    assert step(tf.constant([float(rank)])).numpy().tolist() == [size - 1.0]


def test_retracing_keeps_names_stable(rank, size):
    @tf.function
    def step(x):
        return ops.allreduce_op(x, tfring.Sum)

    for shape in ([1], [2, 2], [1]):
        result = step(tf.fill(shape, float(rank)))
        np.testing.assert_array_equal(
            result.numpy(), np.full(shape, size * (size - 1) / 2.0))


def test_backward_function_names_do_not_depend_on_tracing_history(rank,
                                                                  size):
    # Differentiating a tf.function from an eager tape traces a backward
    # function named `__backward_<name>_<counter>`; the gradient's
    # collectives must not carry the counter.
    if rank == 0:
        for k in range(3):
            tf.function(lambda: tf.constant(k))()

    @tf.function
    def forward(x):
        return ops.allreduce_op(x, tfring.Sum)

    x = tf.constant([1.0 + rank])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = forward(x)
        loss = tf.reduce_sum(y * float(rank + 1))
    grad = tape.gradient(loss, x)
    assert grad.numpy().tolist() == [size * (size + 1) / 2.0]


def test_graph_name_scopes():
    from tfring.ops.collective_ops import _scope_for_graph_name
    assert _scope_for_graph_name("train_step") == "train_step"
    assert _scope_for_graph_name("<lambda>") == "lambda_"
    assert (_scope_for_graph_name("__backward_train_step_1234")
            == "backward_train_step")
    assert (_scope_for_graph_name("__backward___forward_step_12_34")
            == "backward___forward_step")
    assert _scope_for_graph_name("___") == "function"


def test_a_collective_of_a_constant_runs_at_every_call(rank, size):
    # Constant folding (Grappler's, and the graph optimizer's when a function
    # is instantiated) must leave the op to run: folded, it would run once
    # while the graph is optimized and its result would stay frozen (wrong
    # once an elastic job changes size). The timeline counts the runs.
    calls = 3
    directory = tempfile.mkdtemp(prefix="tfring_fold_") if rank == 0 else None
    directory = tfring.broadcast_object(directory, root_rank=0,
                                        name="fold_directory")
    path = os.path.join(directory, "timeline.json")
    function = tf.function(lambda: tfring.allreduce(
        tf.constant([1.0]), op=tfring.Sum, name="folded_in_function"))
    graph = tf.Graph()
    with graph.as_default():
        summed = ops.allreduce_op(tf.constant([2.0]), tfring.Sum,
                                  name="folded_in_graph")
    tfring.start_timeline(path)
    for _ in range(calls):
        assert function().numpy().tolist() == [float(size)]
    with tf.compat.v1.Session(graph=graph) as session:
        for _ in range(calls):
            assert session.run(summed).tolist() == [2.0 * size]
    tfring.stop_timeline()
    if rank != 0:
        return
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e["name"] == "process_name"}
    runs = {}
    for event in events:
        if event.get("ph") != "M" and event["name"] == "allreduce":
            name = rows[event["pid"]]
            runs[name] = runs.get(name, 0) + 1
    assert sorted(runs.values()) == [calls, calls], runs
    assert all("folded_in_" in name for name in runs), runs
