# Gradient compression applied around an allreduce: compress, reduce, restore.
#
# Why: halving the bytes on the wire (float32 -> float16) roughly halves the
# communication time of bandwidth-bound steps, at the cost of precision. The
# interface (Compression.none / Compression.fp16, each with compress() and
# decompress() static methods) is Horovod's, so scripts that pass a
# compressor keep working.

import tensorflow as tf

from tfring.compressors import (  # noqa: F401 (re-exported)
    BF16WireCompressor, Compressor, FP16WireCompressor, NoneCompressor,
    WireCompressor)


class FP16Compressor(Compressor):
    """Sends float32/float64 tensors as float16; other dtypes as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype in (tf.float32, tf.float64):
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is None:
            return tensor
        return tf.cast(tensor, ctx)


class Compression:
    """The compressors to pass as `compression=`: `none`; `fp16` casts
    floating-point tensors to float16 before the collective (Horovod's
    meaning: the whole reduction then runs in float16); `bf16_wire` and
    `fp16_wire` leave the tensors as they are and have the core encode only
    what crosses hosts (docs/compression.md)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16_wire = BF16WireCompressor
    fp16_wire = FP16WireCompressor
