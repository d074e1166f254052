# Gradient compression around a collective: compress, reduce, restore.
#
# Why: sending float32 gradients as float16 halves the bytes the core moves,
# which speeds up bandwidth-bound steps at some cost in precision. The
# interface is horovod.torch's (Compression.none / Compression.fp16, each
# with compress(tensor) -> (tensor, ctx) and decompress(tensor, ctx)), so
# scripts that pass or define a compressor keep working.

import torch

from tfring.compressors import (  # noqa: F401 (re-exported)
    BF16WireCompressor, Compressor, FP16WireCompressor, NoneCompressor,
    WireCompressor)


class FP16Compressor(Compressor):
    """Sends float32 and float64 tensors as float16 and restores their dtype
    afterwards; other dtypes pass unchanged (bfloat16 is already two bytes,
    with a wider range than float16: as on TensorFlow's side)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype in (torch.float32, torch.float64):
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


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
