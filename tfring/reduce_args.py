# Reduction ops and the checks of the arguments every front end's
# collectives share (op, the deprecated `average`, scale factors, root rank).
#
# Why a module without TensorFlow: tfring.collectives (TensorFlow) and
# tfring.torch validate the same arguments with the same messages, and a
# PyTorch process must not load TensorFlow.

import numbers
import warnings

from tfring import _core
from tfring import basics
from tfring import errors

# Reduction ops. The values come from the core's enum (one source for C++ and
# Python) and equal horovod.tensorflow's; like Horovod's they are plain ints,
# so scripts may compare, hash or serialise them as such.
Average = int(_core.ReduceOp.Average)
"""Reduction op: the sum divided by the number of ranks (the default)."""
Sum = int(_core.ReduceOp.Sum)
"""Reduction op: the sum over the ranks."""
Adasum = int(_core.ReduceOp.Adasum)
"""Horovod's Adasum reduction op; not implemented: collectives given it raise UnsupportedOperationError."""
Min = int(_core.ReduceOp.Min)
"""Reduction op: the elementwise minimum over the ranks."""
Max = int(_core.ReduceOp.Max)
"""Reduction op: the elementwise maximum over the ranks."""
Product = int(_core.ReduceOp.Product)
"""Reduction op: the elementwise product over the ranks."""


def _op_names():
    return {int(v): k for k, v in _core.ReduceOp.__members__.items()}


def reduce_op_value(op, api_name):
    """The integer value of a reduce op (enum member or int), validated."""
    if isinstance(op, bool) or not isinstance(
            op, (numbers.Integral, _core.ReduceOp)):
        raise TypeError(
            f"{api_name} received op={op!r} of type {type(op).__name__}. "
            "Expected one of tfring.Average, tfring.Sum, tfring.Min, "
            "tfring.Max, tfring.Product. Pass one of those constants.")
    value = int(op)
    names = _op_names()
    if value not in names:
        raise ValueError(
            f"{api_name} received op={value}, which is not a reduce op. "
            f"Expected one of {sorted(names.items())} (value, name). Pass "
            "one of tfring.Average, tfring.Sum, tfring.Min, tfring.Max, "
            "tfring.Product.")
    if value == int(Adasum):
        raise errors.UnsupportedOperationError(
            f"{api_name} received op=tfring.Adasum, which tfring does not "
            "implement. Expected tfring.Average, tfring.Sum, tfring.Min, "
            "tfring.Max or tfring.Product. Use op=tfring.Average (the "
            "default) for gradient averaging.")
    return value


def reduce_op_name(value):
    return _op_names().get(int(value), str(value))


def resolve_op(op, average, api_name):
    """Horovod's rules for the deprecated `average`; the default is Average."""
    if op is not None:
        if average is not None:
            raise ValueError(
                f"{api_name} received both op={op!r} and average={average!r}. "
                "Expected only one of them; `op` supersedes the deprecated "
                "`average`. Drop `average=`.")
        return reduce_op_value(op, api_name)
    if average is not None:
        warnings.warn(
            "The `average` argument is deprecated; use op=tfring.Average or "
            "op=tfring.Sum instead.", DeprecationWarning, stacklevel=3)
        return int(Average if average else Sum)
    return int(Average)


def check_scale_factor(value, arg, api_name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{api_name} received {arg}={value!r} of type "
            f"{type(value).__name__}. Expected a Python number (it becomes "
            "an attribute of the op, the same on every step). Pass a float, "
            f"e.g. {arg}=1.0.")
    return float(value)


def check_root_rank(root_rank, api_name, membership=None):
    """The validated root_rank: a job rank in [0, size()) and, given the
    Membership of a process set, one of that set's ranks."""
    if isinstance(root_rank, bool) or not isinstance(root_rank,
                                                     numbers.Integral):
        raise TypeError(
            f"{api_name} received root_rank={root_rank!r} of type "
            f"{type(root_rank).__name__}. Expected a Python int in "
            f"[0, tfring.size()). Pass an int, e.g. root_rank=0.")
    n = basics.size()
    if not 0 <= root_rank < n:
        raise ValueError(
            f"{api_name} received root_rank={int(root_rank)}, but there are "
            f"only {n} ranks (tfring.size() == {n}). Expected a rank in "
            f"[0, {n}). Pass a root_rank between 0 and {n - 1}, e.g. "
            "root_rank=0.")
    if membership is not None and int(root_rank) not in membership.ranks:
        raise ValueError(
            f"{api_name} received root_rank={int(root_rank)}, which is not "
            f"in {membership.process_set}. Expected one of its ranks "
            f"{list(membership.ranks)} (root_rank is a job rank, as "
            "tfring.rank() returns, not a position within the set). Pass "
            "one of those.")
    return int(root_rank)
