# What every front end's gradient compressor is: compress(tensor) -> (tensor,
# ctx) before the collective, decompress(tensor, ctx) after it (Horovod's
# interface, so scripts that pass or define a compressor keep working).
#
# Why its own module: the interface, the compressor that changes nothing and
# the wire compressors (which only tell the core how to encode what crosses
# hosts) know no framework; tfring.compression (TensorFlow) and
# tfring.torch.compression each add their float16 cast.


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


class WireCompressor(NoneCompressor):
    """Leaves the tensor as it is and asks the core to encode it where it
    crosses hosts (`wire`: a name of tfring._core.WireCompression). Ranks of
    a host reduce in float32, arrivals are summed in float32; applies to
    float32 Sum/Average allreduces (other tensors move uncompressed), and
    one host gives exactly the uncompressed result."""

    wire = "none"


class BF16WireCompressor(WireCompressor):
    """Across hosts as bfloat16 (float32's range, 8 bits of mantissa)."""

    wire = "bf16"


class FP16WireCompressor(WireCompressor):
    """Across hosts as float16 scaled per block of 256 values by a power of
    two, so no finite gradient overflows (11 bits of mantissa)."""

    wire = "fp16"


def wire_compression(compression):
    """The tfring._core.WireCompression that `compression` asks the core for
    (none for every compressor that is not a WireCompressor)."""
    from tfring import _core  # the native module, loaded on first use
    return getattr(_core.WireCompression, getattr(compression, "wire", "none"))


class PowerSGDSettings(Compressor):
    """What every front end's PowerSGD is configured with (the names of
    DDP's PowerSGDState), checked once here. A PowerSGD object reduces whole
    gradient lists (the optimizer or tape hands it the list), so as a
    per-tensor compressor of one collective it is refused."""

    # The tape / optimizer hands the whole gradient list to
    # reduce_gradient_list() instead of reducing tensor by tensor.
    reduces_gradient_lists = True
    # Set by each front end: its public name, where it may be passed, and
    # the wire compressor to use for a single allreduce instead.
    api_name = "tfring.PowerSGD"
    accepted_by = "tfring.DistributedGradientTape"
    wire_alternative = "tfring.Compression.bf16_wire"

    def _configure(self, rank, start_iter, min_compression_rate,
                   use_error_feedback, warm_start, orthogonalization_epsilon,
                   seed):
        check_powersgd_arguments(f"{self.api_name}()", rank, start_iter)
        self.matrix_rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.epsilon = float(orthogonalization_epsilon)
        self.seed = int(seed)

    def compresses(self, rows, columns, rank):
        """Whether a rows x columns gradient goes as rank-`rank` factors."""
        return rank >= 1 and powersgd_compresses(
            rows, columns, rank, self.min_compression_rate)

    @classmethod
    def compress(cls, tensor):
        raise TypeError(
            f"{cls.api_name} compresses the gradients of a whole model, not "
            "one tensor: it received a single tensor from a collective. Pass "
            f"it as compression= to {cls.accepted_by}, or use "
            f"{cls.wire_alternative} for a single allreduce.")

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def check_powersgd_arguments(api_name, rank, start_iter):
    """Raises ValueError unless `rank` (of PowerSGD's approximations) is an
    integer >= 1 and `start_iter` one >= 0 (both front ends' PowerSGD)."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(
            f"{api_name} received rank={rank!r}. Expected an integer of at "
            "least 1 (the rank of each gradient's approximation). Pass e.g. "
            "rank=4.")
    if not isinstance(start_iter, int) or isinstance(start_iter, bool) or start_iter < 0:
        raise ValueError(
            f"{api_name} received start_iter={start_iter!r}. Expected a "
            "non-negative integer (uncompressed steps before compression "
            "starts). Pass e.g. start_iter=10.")


def powersgd_compresses(rows, columns, rank, min_compression_rate):
    """Whether PowerSGD sends a rows x columns gradient as rank-`rank`
    factors: (rows + columns) * rank values must save more than a factor
    `min_compression_rate` over rows * columns (as DDP's hook decides)."""
    return (rows + columns) * rank * min_compression_rate < rows * columns
