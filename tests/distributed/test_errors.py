# Errors at any number of ranks: argument errors caught in Python before any
# C++ runs, cross-rank mismatches reported by the core on every rank (naming
# the tensor, the field and which ranks held which value) after which
# collectives keep working, a name used twice in flight, and use before
# init() and after shutdown().

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import tfring
from tfring import collectives
from tfring import errors


def _others(size):
    """How the core lists ranks 1..size-1 holding one value."""
    if size == 2:
        return "rank 1 submitted"
    return "ranks " + ", ".join(str(r) for r in range(1, size)) + " submitted"


def _still_works(size, rank):
    result = tfring.allreduce(tf.constant([float(rank), 1.0]), op=tfring.Sum,
                              name="after_error")
    np.testing.assert_allclose(result.numpy(), [sum(range(size)), size])


# name -> (what rank r runs, the field, rank 0's value, the others' value)
MISMATCHES = {
    "shape": (lambda r, n: tfring.allreduce(
        tf.zeros([2] if r == 0 else [3]), op=tfring.Sum, name=n),
        "shape", "[2]", "[3]"),
    "ndims": (lambda r, n: tfring.allreduce(
        tf.zeros([2] if r == 0 else [2, 1]), op=tfring.Sum, name=n),
        "shape", "[2]", "[2, 1]"),
    "dtype": (lambda r, n: tfring.allreduce(
        tf.zeros([2], tf.float32 if r == 0 else tf.float64), op=tfring.Sum,
        name=n), "dtype", "float32", "float64"),
    "op": (lambda r, n: tfring.allreduce(
        tf.zeros([2]), op=tfring.Sum if r == 0 else tfring.Max, name=n),
        "reduction op", "Sum", "Max"),
    "prescale": (lambda r, n: tfring.allreduce(
        tf.zeros([2]), op=tfring.Sum, prescale_factor=1.0 if r == 0 else 2.5,
        name=n), "prescale_factor", "1", "2.5"),
    "postscale": (lambda r, n: tfring.allreduce(
        tf.zeros([2]), op=tfring.Sum, postscale_factor=1.0 if r == 0 else 0.5,
        name=n), "postscale_factor", "1", "0.5"),
    "root_rank": (lambda r, n: tfring.broadcast(
        tf.zeros([2]), 0 if r == 0 else 1, name=n), "root rank", "0", "1"),
    "collective": (lambda r, n: (
        tfring.allreduce(tf.zeros([2]), op=tfring.Sum, name=n) if r == 0
        else tfring.broadcast(tf.zeros([2]), 0, name=n)),
        "collective operation", "allreduce", "broadcast"),
    "allgather_trailing": (lambda r, n: tfring.allgather(
        tf.zeros([1, 2] if r == 0 else [3, 4]), name=n),
        "shape after the first dimension", "[2]", "[4]"),
}


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("kind", sorted(MISMATCHES))
def test_mismatch_fails_on_every_rank(kind, size, rank):
    run, field, value0, value_others = MISMATCHES[kind]
    name = f"mismatch_{kind}"
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        run(rank, name)
    message = info.value.message
    assert f"'{name}'" in message, message
    assert f"disagree on the {field}" in message, message
    assert f"rank 0 submitted {value0}" in message, message
    assert f"{_others(size)} {value_others}" in message, message
    _still_works(size, rank)
    # The same name works again once everyone agrees.
    ok = tfring.allreduce(tf.ones([2]), op=tfring.Sum, name=name) if (
        kind != "root_rank") else tfring.broadcast(tf.ones([2]), 0, name=name)
    assert ok.shape == (2,)


@pytest.mark.requires_ranks(2)
def test_mismatch_inside_tf_function(size, rank):
    @tf.function
    def step(x, y):
        return (tfring.allreduce(x, op=tfring.Sum),
                tfring.allreduce(y, op=tfring.Sum))

    x = tf.ones([3])
    y = tf.ones([4] if rank == 0 else [5])
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        step(x, y)
    message = info.value.message
    assert "rank 0 submitted [4]" in message, message
    assert f"{_others(size)} [5]" in message, message
    assert "step/" in message, message  # names the tensor by its node
    _still_works(size, rank)
    np.testing.assert_allclose(step(x, tf.ones([4]))[1].numpy(), [size] * 4)


@pytest.mark.requires_ranks(2)
def test_name_in_flight_twice(size, rank):
    # Rank 0 submits "dup" twice while the other ranks hold back, so the
    # first is still pending when the second arrives; then they submit once.
    world = MPI.COMM_WORLD
    if rank == 0:
        outcomes = []

        def submit():
            try:
                tfring.allreduce(tf.ones([2]), op=tfring.Sum, name="dup")
                outcomes.append("ok")
            except tf.errors.OpError as e:
                outcomes.append(e)

        threads = [threading.Thread(target=submit) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.3)
        deadline = time.time() + 30
        while not outcomes and time.time() < deadline:
            time.sleep(0.01)
        assert len(outcomes) == 1 and outcomes[0] != "ok", outcomes
        world.Barrier()
        for t in threads:
            t.join(30)
        assert outcomes[1] == "ok"
        message = outcomes[0].message
        assert "'dup'" in message and "already in flight" in message, message
    else:
        world.Barrier()
        tfring.allreduce(tf.ones([2]), op=tfring.Sum, name="dup")
    _still_works(size, rank)


@pytest.mark.parametrize("dtype", [tf.bool, tf.uint16, tf.int16, tf.string,
                                   tf.complex64])
def test_allreduce_rejects_unsupported_dtype(dtype):
    tensor = tf.zeros([2], dtype) if dtype != tf.string else tf.constant(["a"])
    with pytest.raises(TypeError) as info:
        tfring.allreduce(tensor, op=tfring.Sum, name="bad_dtype")
    message = str(info.value)
    assert f"received a {dtype.name} tensor (tensor 'bad_dtype')" in message
    assert "Expected one of: bfloat16, float16" in message
    assert "tf.cast(" in message
    with pytest.raises(TypeError, match=dtype.name):
        tfring.grouped_allreduce([tf.ones([1]), tensor])


@pytest.mark.parametrize("dtype", [tf.string, tf.complex64, tf.uint32])
def test_allgather_and_broadcast_reject_unsupported_dtype(dtype):
    tensor = tf.zeros([2], dtype) if dtype != tf.string else tf.constant(["a"])
    for fn in (lambda: tfring.allgather(tensor),
               lambda: tfring.broadcast(tensor, 0)):
        with pytest.raises(TypeError, match="Expected one of: bfloat16"):
            fn()


def test_python_dtype_sets_match_the_kernels():
    # Outside the Python sets the kernels must refuse too (inside them the
    # collective tests show they work), so Python's check is never stricter
    # or looser than the op library.
    candidates = [tf.bool, tf.uint16, tf.int16, tf.uint32, tf.uint64,
                  tf.complex64, tf.complex128, tf.qint8]
    for dtype in candidates:
        x = tf.zeros([1], dtype)
        if dtype not in collectives.ALLREDUCE_DTYPES:
            with pytest.raises((TypeError, ValueError, tf.errors.OpError)):
                tfring.ops.allreduce_op(x, int(tfring.Sum))
        if dtype not in collectives.GATHER_BROADCAST_DTYPES:
            with pytest.raises((TypeError, ValueError, tf.errors.OpError)):
                tfring.ops.allgather_op(x)
            with pytest.raises((TypeError, ValueError, tf.errors.OpError)):
                tfring.ops.broadcast_op(x, 0)


@pytest.mark.parametrize("root", [-1, "size", 1000])
def test_bad_root_rank_value(root, size):
    root = size if root == "size" else root
    calls = [lambda: tfring.broadcast(tf.ones([1]), root),
             lambda: tfring.broadcast_object(1, root_rank=root),
             lambda: tfring.broadcast_variables([tf.Variable(1.0)], root)]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert f"root_rank={root}" in message
        assert f"only {size} ranks" in message
        assert f"between 0 and {size - 1}" in message


@pytest.mark.parametrize("root", ["0", 1.0, True, None])
def test_bad_root_rank_type(root):
    with pytest.raises(TypeError, match="Expected a Python int"):
        tfring.broadcast(tf.ones([1]), root)


def test_adasum_is_not_implemented():
    for call in (lambda: tfring.allreduce(tf.ones([1]), op=tfring.Adasum),
                 lambda: tfring.grouped_allreduce([tf.ones([1])],
                                                  op=tfring.Adasum)):
        with pytest.raises(errors.UnsupportedOperationError) as info:
            call()
        assert isinstance(info.value, NotImplementedError)
        assert isinstance(info.value, ValueError)
        assert "op=tfring.Average" in str(info.value)


def test_bad_op_and_scale_factor():
    with pytest.raises(ValueError, match="op=42, which is not a reduce op"):
        tfring.allreduce(tf.ones([1]), op=42)
    with pytest.raises(TypeError, match="op='sum'"):
        tfring.allreduce(tf.ones([1]), op="sum")
    with pytest.raises(TypeError, match="prescale_factor='2'"):
        tfring.allreduce(tf.ones([1]), prescale_factor="2")
    with pytest.raises(TypeError, match="postscale_factor"):
        tfring.allreduce(tf.ones([1]), postscale_factor=tf.constant(2.0))
    with pytest.raises(TypeError, match="Expected a list"):
        tfring.grouped_allreduce(tf.ones([1]))
    with pytest.raises(TypeError, match="IndexedSlices"):
        tfring.allgather(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0])))


_LIFECYCLE_SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    import tfring

    def expect(call, text):
        try:
            call()
        except ValueError as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError("no error for " + text)

    calls = {
        "tfring.rank()": tfring.rank,
        "tfring.size()": tfring.size,
        "tfring.local_rank()": tfring.local_rank,
        "tfring.mpi_threads_supported()": tfring.mpi_threads_supported,
        "tfring.allreduce()": lambda: tfring.allreduce(tf.ones([1])),
        "tfring.grouped_allreduce()": lambda: tfring.grouped_allreduce([]),
        "tfring.allgather()": lambda: tfring.allgather(tf.ones([1])),
        "tfring.broadcast()": lambda: tfring.broadcast(tf.ones([1]), 0),
        "tfring.broadcast_object()": lambda: tfring.broadcast_object(1),
        "tfring.allgather_object()": lambda: tfring.allgather_object(1),
        "tfring.broadcast_variables()":
            lambda: tfring.broadcast_variables([], 0),
    }
    assert not tfring.is_initialized()
    for api, call in calls.items():
        expect(call, "tfring has not been initialized; call tfring.init() "
               "first. `" + api + "` was called before `tfring.init()`")
    tfring.shutdown()  # before init: nothing to do

    tfring.init()
    assert tfring.size() == 1 and tfring.is_initialized()
    tfring.shutdown()
    tfring.shutdown()  # twice is fine
    assert not tfring.is_initialized()
    for api, call in calls.items():
        expect(call, "tfring has been shut down: `" + api + "` was called "
               "after `tfring.shutdown()`")
    try:  # The op library itself also refuses, naming the fix.
        tfring.ops.allreduce_op(tf.ones([1]), int(tfring.Sum))
    except tf.errors.FailedPreconditionError as e:
        assert "tfring.init()" in e.message, e.message
    else:
        raise AssertionError("the op ran after shutdown")

    tfring.init()  # again
    assert float(tfring.allreduce(tf.constant(2.0))) == 2.0
    print("LIFECYCLE OK")
""")


def test_use_before_init_and_after_shutdown(rank):
    if rank != 0:
        return  # One standalone process is enough; it talks to no peer.
    # A fresh process, outside this MPI job: drop the launcher's variables.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    result = subprocess.run([sys.executable, "-c", _LIFECYCLE_SCRIPT],
                            env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0 and "LIFECYCLE OK" in result.stdout, (
        result.stdout[-3000:] + result.stderr[-3000:])


def test_shutdown_on_every_rank_then_init_again(size, rank):
    # Last in this file: a coordinated shutdown, the errors after it, and a
    # restart that works like the first start.
    tfring.shutdown()
    assert not tfring.is_initialized()
    with pytest.raises(ValueError, match="has been shut down"):
        tfring.rank()
    with pytest.raises(ValueError, match="Call `tfring.init\\(\\)` again"):
        tfring.allreduce(tf.ones([1]))
    tfring.init()
    assert tfring.rank() == rank
    _still_works(size, rank)
