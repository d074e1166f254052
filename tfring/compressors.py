# What every front end's gradient compressor is: compress(tensor) -> (tensor,
# ctx) before the collective, decompress(tensor, ctx) after it (Horovod's
# interface, so scripts that pass or define a compressor keep working).
#
# Why its own module: the interface and the compressor that changes nothing
# know no framework; tfring.compression (TensorFlow) and
# tfring.torch.compression each add their float16 compressor.


class Compressor:
    """compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
