"""Converting test values to and from every dtype the collectives support.

Shared by the op tests: values are generated as float64 arrays, turned into
a tensor of the dtype under test (bool: odd values are True), and results are
compared back as float64.
"""
import numpy as np
import tensorflow as tf


def to_tensor(values, dtype):
    if dtype == tf.bool:
        return tf.constant(values % 2 == 1)
    return tf.cast(tf.constant(values), dtype)


def to_float64(tensor):
    if tensor.dtype == tf.bool:
        return tensor.numpy().astype(np.float64)
    return tf.cast(tensor, tf.float64).numpy()
