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
