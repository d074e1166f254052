# The Tfring>Broadcast op through tfring.ops.broadcast_op, at any number of
# ranks: every dtype x 0-3 dimensions and zero-element shapes x every root
# rank, eagerly and in tf.function, and the error for a root that is not a
# rank of the job.

import numpy as np
import pytest
import tensorflow as tf

from tfring import ops
from dtype_values import to_float64, to_tensor

BROADCAST_DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32,
                    tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64,
                    tf.bool]
SHAPES = [(), (5,), (3, 4), (2, 3, 2), (0,), (2, 0, 3)]


def _rank_values(shape, rank):
    """float64 values exact in every dtype; rank r's differ from rank s's."""
    count = int(np.prod(shape, dtype=np.int64))
    return ((np.arange(count) + 3 * rank) % 50).reshape(shape).astype(
        np.float64)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", BROADCAST_DTYPES, ids=lambda d: d.name)
def test_broadcast_every_dtype_shape_and_root(dtype, mode, rank, size):
    inputs = [to_tensor(_rank_values(shape, rank), dtype) for shape in SHAPES]

    def run(tensors, root_rank):
        return [ops.broadcast_op(t, root_rank) for t in tensors]

    if mode == "function":
        run = tf.function(run)
    for root_rank in range(size):
        for shape, result in zip(SHAPES, run(inputs, root_rank)):
            what = f"{dtype.name}{list(shape)} from root {root_rank} ({mode})"
            assert result.dtype == dtype, what
            expected = _rank_values(shape, root_rank)
            if dtype == tf.bool:
                expected = expected % 2
            assert result.shape == shape, what
            np.testing.assert_array_equal(to_float64(result), expected,
                                          err_msg=what)


def test_variable_input_is_left_unchanged(rank, size):
    v = tf.Variable([float(rank), 1.0])
    result = ops.broadcast_op(v, size - 1)
    assert result.numpy().tolist() == [size - 1.0, 1.0]
    assert v.numpy().tolist() == [float(rank), 1.0]


def test_static_shape_is_the_input_shape():
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32)])
    def run(x):
        y = ops.broadcast_op(x, 0)
        assert y.shape.as_list() == [None, 2]
        return y

    assert run(tf.zeros([4, 2], tf.int32)).shape == (4, 2)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("bad_root", [-1, "size"])
def test_root_rank_out_of_range(bad_root, mode, size):
    root_rank = size if bad_root == "size" else bad_root
    x = tf.constant([1.0])

    def run():
        return ops.broadcast_op(x, root_rank, name="weights")

    if mode == "function":
        run = tf.function(run)
    # Checked by every rank's kernel before anything is sent, so no rank
    # waits for the others.
    # Eagerly the name is `name`; in a function, "run/weights".
    tensor = "weights" if mode == "eager" else "run/weights"
    message = (rf"broadcast of tensor '{tensor}': root_rank {root_rank} is "
               rf"not a rank of this job \(size {size}, ranks 0..{size - 1}\)")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        run()


@pytest.mark.requires_ranks(2)
def test_root_rank_mismatch_is_reported(rank):
    with pytest.raises(tf.errors.FailedPreconditionError, match="root"):
        ops.broadcast_op(tf.constant([1.0]), rank % 2, name="which_root")
    # The next collective still works.
    assert ops.broadcast_op(tf.constant([rank]), 0).numpy().tolist() == [0]
