# broadcast_variables, broadcast_object, allgather_object at any number of
# ranks: eagerly, in tf.function, with Keras 3 variables, and in tf.compat.v1.

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfring


def _all_equal_across_ranks(values):
    """Whether every rank holds the same numpy array."""
    gathered = tfring.allgather_object(np.asarray(values))
    return all(np.array_equal(gathered[0], g) for g in gathered)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_broadcast_variables(mode, size, rank):
    for root in range(size):
        variables = [tf.Variable([1.0 * rank, 2.0]),
                     tf.Variable([[rank, 7]], dtype=tf.int32),
                     tf.Variable(rank % 2 == 1),
                     tf.Variable(tf.zeros([0, 3], tf.float64) + rank)]
        if mode == "eager":
            assert tfring.broadcast_variables(variables, root) is None
        else:
            @tf.function
            def assign():
                op = tfring.broadcast_variables(variables, root)
                assert isinstance(op, tf.Operation)

            assign()
        np.testing.assert_allclose(variables[0].numpy(), [1.0 * root, 2.0])
        np.testing.assert_array_equal(variables[1].numpy(), [[root, 7]])
        assert bool(variables[2].numpy()) == (root % 2 == 1)
        assert variables[3].shape == (0, 3)


def test_broadcast_variables_of_a_keras_model(size, rank):
    keras.utils.set_random_seed(100 + rank)  # different weights per rank
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    if size > 1:
        assert not _all_equal_across_ranks(model.layers[0].kernel.numpy())
    tfring.broadcast_variables(model.variables + optimizer.variables, 0)
    for v in model.variables:
        assert _all_equal_across_ranks(v.numpy()), v.path
    tfring.broadcast_variables([], 0)  # Nothing to do.


def test_broadcast_object(size, rank):
    for root in range(size):
        obj = {"root": rank, "payload": list(range(rank * 10)),
               "array": np.full([2, 2], rank)} if rank == root else None
        got = tfring.broadcast_object(obj, root_rank=root)
        assert got["root"] == root
        assert got["payload"] == list(range(root * 10))
        np.testing.assert_array_equal(got["array"], np.full([2, 2], root))
    # Default root 0, an explicit name, a large object.
    big = bytes(range(256)) * 4096 if rank == 0 else b""
    assert tfring.broadcast_object(big, name="big_blob") == (
        bytes(range(256)) * 4096)
    assert tfring.broadcast_object(rank) == 0


def test_allgather_object(size, rank):
    objs = tfring.allgather_object({"rank": rank, "text": "x" * rank})
    assert objs == [{"rank": r, "text": "x" * r} for r in range(size)]
    assert tfring.allgather_object(None, name="nothing") == [None] * size
    assert tfring.allgather_object(rank * 1.5) == [r * 1.5
                                                   for r in range(size)]


def test_object_functions_refuse_tf_function():
    @tf.function
    def inside():
        return tfring.broadcast_object(1)

    with pytest.raises(RuntimeError, match="outside tf.function"):
        inside()


def test_compat_v1_graph_functions(size, rank):
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable(
            "v", initializer=tf.constant([float(rank), 1.0]))
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(rank))
        bcast_all = tfring.broadcast_global_variables(size - 1)
        bcast_v = tfring.broadcast_variables([v], 0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast_all)
            np.testing.assert_allclose(sess.run(v), [size - 1.0, 1.0])
            assert sess.run(w) == size - 1
            sess.run(v.assign([float(rank), 2.0]))
            sess.run(bcast_v)
            np.testing.assert_allclose(sess.run(v), [0.0, 2.0])
            got = tfring.broadcast_object({"r": rank}, 0, session=sess)
            assert got == {"r": 0}
            with sess.as_default():
                assert tfring.allgather_object(rank) == list(range(size))
        with pytest.raises(RuntimeError, match="without a session"):
            tfring.allgather_object(rank)


def test_broadcast_global_variables_refuses_eager():
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        tfring.broadcast_global_variables(0)


# --- broadcast_: Horovod's in-place broadcast of variables ----------------


def _broadcast_inplace_variables(rank):
    """Variables of several dtypes and shapes holding this rank's values."""
    return [tf.Variable([1.0 * rank, 2.0]),
            tf.Variable([[rank, 7]], dtype=tf.int32),
            tf.Variable(rank % 2 == 1),
            tf.Variable(tf.ones([2, 3], tf.float16) * rank),
            tf.Variable(tf.zeros([0, 3], tf.float64) + rank),
            keras.Variable(np.full([3], rank, np.int64))]


def _check_broadcast_inplace_result(result, variables, root):
    expected = [np.array([1.0 * root, 2.0]), np.array([[root, 7]]),
                np.array(root % 2 == 1), np.ones([2, 3]) * root,
                np.zeros([0, 3]), np.full([3], root)]
    assert isinstance(result, list) and len(result) == len(variables)
    for value, var, want in zip(result, variables, expected):
        # Horovod's contract: one tensor per variable, of its dtype, equal
        # to the variable after the broadcast, which holds root's value.
        assert isinstance(value, tf.Tensor)
        assert value.dtype == tf.as_dtype(var.dtype)
        assert value.shape == tuple(var.shape)
        np.testing.assert_array_equal(value.numpy(), want)
        np.testing.assert_array_equal(np.asarray(var.numpy()), want)


@pytest.mark.parametrize("name", [None, "inplace"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_broadcast_inplace(mode, name, size, rank):
    for root in range(size):
        variables = _broadcast_inplace_variables(rank)
        if mode == "eager":
            result = tfring.broadcast_(variables, root, name=name)
        else:
            # The returned tensors read the variables after the broadcast.
            result = tf.function(
                lambda: tfring.broadcast_(variables, root, name=name))()
        _check_broadcast_inplace_result(result, variables, root)
    assert tfring.broadcast_([], 0) == []


def test_broadcast_inplace_repeated_and_of_a_keras_model(size, rank):
    keras.utils.set_random_seed(200 + rank)  # different weights per rank
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    for step in range(3):  # cached function, changing values
        root = step % size
        for v in model.variables:
            v.assign(tf.fill(v.shape, float(rank + 10 * step)))
        values = tfring.broadcast_(model.variables, root_rank=root)
        for value, v in zip(values, model.variables):
            np.testing.assert_array_equal(value.numpy(), v.numpy())
            np.testing.assert_array_equal(
                v.numpy(), np.full(v.shape, root + 10.0 * step))


def test_broadcast_inplace_compat_v1_graph(size, rank):
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable(
            "v", initializer=tf.constant([float(rank), 1.0]))
        ref = tf.compat.v1.Variable([rank, rank], use_resource=False)
        result = tfring.broadcast_([v, ref], size - 1)
        assert isinstance(result, list)
        assert all(isinstance(t, tf.Tensor) for t in result)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got_v, got_ref = sess.run(result)  # runs the broadcast
            np.testing.assert_array_equal(got_v, [size - 1.0, 1.0])
            np.testing.assert_array_equal(got_ref, [size - 1, size - 1])
            np.testing.assert_array_equal(sess.run(v), [size - 1.0, 1.0])
            np.testing.assert_array_equal(sess.run(ref), [size - 1] * 2)


def _shutdown_together():
    # Every rank finishes its collectives before tfring stops (see
    # test_process_sets.py).
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()
    tfring.shutdown()


@pytest.fixture
def upper_ranks_set(size):
    """ProcessSet of the ranks 1..size-1, registered (None at one rank:
    a set of every rank cannot be registered); tfring as conftest left it
    afterwards."""
    if size == 1:
        yield None
        return
    process_set = tfring.ProcessSet(list(range(1, size)))
    _shutdown_together()
    tfring.init(process_sets=[process_set])
    try:
        yield process_set
    finally:
        _shutdown_together()
        tfring.init()


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_broadcast_inplace_in_a_process_set(mode, size, rank,
                                            upper_ranks_set):
    sets = [tfring.global_process_set]
    if upper_ranks_set is not None and upper_ranks_set.included():
        sets.append(upper_ranks_set)
    for process_set in sets:
        for root in process_set.ranks:
            variables = _broadcast_inplace_variables(rank)

            def run():
                return tfring.broadcast_(variables, root,
                                         process_set=process_set)

            result = run() if mode == "eager" else tf.function(run)()
            _check_broadcast_inplace_result(result, variables, root)
    if upper_ranks_set is None:
        return
    var = tf.Variable([float(rank)])
    if upper_ranks_set.included():
        with pytest.raises(ValueError,
                           match=r"tfring.broadcast_\(\) received "
                                 r"root_rank=0, which is not in ProcessSet"):
            tfring.broadcast_([var], 0, process_set=upper_ranks_set)
    else:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"tfring.broadcast_\(\) was called on rank 0"
                                 r" with process_set=.*which does not "
                                 r"contain rank 0"):
            tfring.broadcast_([var], 0, process_set=upper_ranks_set)
    np.testing.assert_array_equal(var.numpy(), [float(rank)])


def test_broadcast_inplace_errors(size):
    var = tf.Variable([1.0])
    with pytest.raises(TypeError,
                       match=r"tfring.broadcast_\(\) received an object of "
                             r"type EagerTensor at position 1 of `variables`. Expected variables"
                             r".*Use tfring.broadcast\(\) for tensors"):
        tfring.broadcast_([var, tf.constant([1.0])], 0)
    with pytest.raises(TypeError,
                       match=r"tfring.broadcast_\(\) received `variables` "
                             r"of type ResourceVariable. Expected a list or tuple of "
                             r"variables.*e.g. \[var\]"):
        tfring.broadcast_(var, 0)
    with pytest.raises(ValueError,
                       match=rf"tfring.broadcast_\(\) received "
                             rf"root_rank={size}, but there are only {size} "
                             "ranks"):
        tfring.broadcast_([var], size)
    with pytest.raises(TypeError, match=r"tfring.broadcast_\(\) received "
                                        r"root_rank='0' of type str"):
        tfring.broadcast_([var], "0")
    with pytest.raises(ValueError, match=r"tfring.broadcast_\(\) received "
                                         r"ProcessSet\(process_set_id=None"):
        tfring.broadcast_([var], 0, process_set=tfring.ProcessSet([0]))
    np.testing.assert_array_equal(var.numpy(), [1.0])
