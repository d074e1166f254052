"""What each collective of the soak must return, computed with NumPy from
every rank's input, and the comparison of tfring's result with it.

Why its own file: the reference is the soak's judge, so it shares nothing
with the code under test. It follows tfring's documented semantics
(docs/collectives.md):

* allreduce / reducescatter: each rank's input is multiplied by the
  prescale factor, reduced (Sum, Min, Max, Product; Average is Sum), then
  multiplied by the postscale factor and, for Average, divided by the number
  of ranks. The factors are TensorFlow op attributes of type float, so they
  arrive rounded to float32 (0.1 is 0.10000000149), as in Horovod.
  Integers are exact: a factor other than 1 goes through double precision
  and truncates toward zero, the Average division is an integer division
  truncating toward zero. Floating-point results are compared
  within a bound derived from the dtype's precision and the size of the
  values summed (16-bit floats may be accumulated in float32 or in their own
  precision, depending on the data path).
* reducescatter: rank i keeps block i of dimension 0; the first
  dim0 % size ranks get one row more.
* allgather: every rank's rows concatenated in rank order (a scalar is one
  row); broadcast: the root's tensor; alltoall: the rows every rank sent to
  this one, in rank order, and with splits also the row counts received.
  These only move data, so they are compared bit for bit, floats included.
"""

import numpy as np

from soak import plan

# Machine epsilon of each floating dtype (results may round more than once,
# so the bound below multiplies it by the number of roundings).
_EPSILON = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7,
            "float32": 2.0 ** -23, "float64": 2.0 ** -52}
# The smallest normal number: the absolute floor of the float bound.
_TINY = {"float16": 6.1e-5, "bfloat16": 1.2e-38, "float32": 1.2e-38,
         "float64": 2.3e-308}


class Expected:
    """One expected output: its values (in the tensor's dtype, or float64
    with `bound` for floating-point reductions) and, for floats, the largest
    allowed absolute difference per element."""

    def __init__(self, values, bound=None):
        self.values = values
        self.bound = bound

    def corrupt(self):
        """A copy with one value changed (for the soak's self-test)."""
        values = np.array(self.values, copy=True)
        flat = values.reshape(-1)
        if values.dtype == bool:
            flat[0] = not flat[0]
        elif self.bound is not None:
            flat[0] += 1.0 + 4.0 * self.bound.reshape(-1)[0]
        elif np.issubdtype(values.dtype, np.integer):
            flat[0] ^= 1
        else:  # a float moved, not computed: negation always changes it
            flat[0] = -flat[0] if flat[0] != 0 else 1
        return Expected(values, self.bound)


def op_factor(factor):
    """A scale factor as the core receives it: TensorFlow op attributes of
    type float are 32-bit (as Horovod's), so 0.1 arrives as float32(0.1),
    then is used in double precision."""
    return float(np.float32(factor))


def _truncated(values, factor):
    """Integers times `factor` in double precision, truncated toward zero
    (what tfring does for integer tensors)."""
    if factor == 1.0:
        return values
    return np.trunc(values.astype(np.float64) * factor).astype(np.int64)


def _integer_divide(values, divisor):
    """Division truncating toward zero."""
    quotient = np.abs(values) // divisor
    return np.where(values < 0, -quotient, quotient)


def _reduce(collective, inputs, size):
    """The reduction of every rank's input, as an Expected of the full
    tensor (before reducescatter keeps a block of it)."""
    op = collective.op
    pre, post = op_factor(collective.prescale), op_factor(collective.postscale)
    dtype = collective.dtype
    if plan.is_float(dtype):
        scaled = [x.astype(np.float64) * pre for x in inputs]
        stack = np.stack(scaled)
        divisor = size if op == "Average" else 1
        if op in ("Sum", "Average"):
            total = stack.sum(axis=0)
            magnitude = np.abs(stack).sum(axis=0)
        elif op == "Min":
            total = stack.min(axis=0)
            magnitude = np.abs(total)
        elif op == "Max":
            total = stack.max(axis=0)
            magnitude = np.abs(total)
        else:  # Product: the error grows with every factor
            total = stack.prod(axis=0)
            magnitude = np.abs(total)
        factor = post / divisor
        values = total * factor
        # Each rank's scaling, each partial sum and the final scaling may
        # round once in the dtype.
        rounding = (size + 4) * _EPSILON[dtype]
        bound = rounding * magnitude * abs(factor) + _TINY[dtype]
        return Expected(values, bound)
    stack = np.stack([_truncated(x.astype(np.int64), pre) for x in inputs])
    if op in ("Sum", "Average"):
        total = stack.sum(axis=0)
    elif op == "Min":
        total = stack.min(axis=0)
    elif op == "Max":
        total = stack.max(axis=0)
    else:
        total = stack.prod(axis=0)
    total = _truncated(total, post)
    if op == "Average":
        total = _integer_divide(total, size)
    target = plan.np_dtype(dtype)
    info = np.iinfo(target)
    if total.size and (total.min() < info.min or total.max() > info.max):
        raise ValueError(f"the soak's plan overflows {dtype} for "
                         f"{collective}: inputs must be bounded tighter")
    return Expected(total.astype(target))


def _block(rows, size, rank):
    """reducescatter's rows [start, stop) for `rank`."""
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def expected_outputs(use, inputs, rank, size):
    """The Expected outputs of `use` on `rank`: one, or two for an alltoall
    with splits (the tensor and the received splits). `inputs` holds every
    rank's input."""
    collective = use.collective
    kind = collective.kind
    if kind in ("allreduce", "reducescatter"):
        full = _reduce(collective, inputs, size)
        if kind == "allreduce":
            return [full]
        start, stop = _block(use.shapes[0][0], size, rank)
        bound = None if full.bound is None else full.bound[start:stop]
        return [Expected(full.values[start:stop], bound)]
    if kind == "broadcast":
        return [Expected(inputs[use.root])]
    if kind == "allgather":
        return [Expected(np.concatenate([x if x.ndim else x.reshape(1)
                                         for x in inputs]))]
    # alltoall
    pieces, received = [], []
    for source, x in enumerate(inputs):
        if use.splits is None:
            count = x.shape[0] // size
            start = rank * count
        else:
            row = use.splits[source]
            count = row[rank]
            start = sum(row[:rank])
        pieces.append(x[start:start + count])
        received.append(count)
    outputs = [Expected(np.concatenate(pieces))]
    if use.splits is not None:
        outputs.append(Expected(np.array(received, dtype=np.int32)))
    return outputs


def _first_difference(got, expected, wrong):
    index = tuple(int(i) for i in np.argwhere(wrong)[0])
    return (f"first difference at index {index}: got {got[index]!r}, "
            f"expected {expected.values[index]!r}"
            + ("" if expected.bound is None else
               f" (allowed difference {expected.bound[index]:.3g})"))


def mismatch(got, expected, dtype):
    """None when `got` (a NumPy array from a tensor) has `dtype` (a NumPy
    dtype) and matches `expected`; otherwise what differs, in words."""
    want = expected.values
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != dtype:
        return f"dtype {got.dtype}, expected {dtype}"
    if expected.bound is None:
        if np.array_equal(got, want):
            return None
        wrong = got != want
        return (f"{int(wrong.sum())} of {got.size} values differ; "
                + _first_difference(got, expected, wrong))
    actual = got.astype(np.float64)
    wrong = ~(np.abs(actual - want) <= expected.bound)  # NaN counts as wrong
    if not wrong.any():
        return None
    return (f"{int(wrong.sum())} of {got.size} values outside the tolerance; "
            + _first_difference(actual, expected, wrong))
