# Which torch dtypes reach the core, and as which of the core's DataTypes.
#
# Why one table: every collective checks its tensors against it before any
# address goes to C++, and the core's DataType enum (tfring._core, bound from
# cc/common.h) is the only source of the values, so nothing is copied by
# hand. Reductions (allreduce, reducescatter) take the dtypes the core can
# reduce (_core.reducible); the others move any of them.

import torch

from tfring import _core

_BY_NAME = {
    "uint8": torch.uint8,
    "int8": torch.int8,
    "uint16": getattr(torch, "uint16", None),  # torch >= 2.3
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "bool": torch.bool,
}

CORE_DTYPES = {
    torch_dtype: _core.DataType.__members__[name]
    for name, torch_dtype in _BY_NAME.items() if torch_dtype is not None
}
REDUCIBLE_DTYPES = frozenset(
    d for d, core in CORE_DTYPES.items() if _core.reducible(core))


def _names(dtypes):
    return ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes))


def core_dtype(tensor, api_name, reduction):
    """The core DataType of `tensor`; ValueError (Horovod's type for an
    unsupported tensor type) naming the supported ones."""
    allowed = REDUCIBLE_DTYPES if reduction else frozenset(CORE_DTYPES)
    if tensor.dtype not in allowed:
        kind = "reduce" if reduction else "move"
        raise ValueError(
            f"{api_name} received a tensor of dtype {tensor.dtype}, which "
            f"tfring cannot {kind}. Expected one of: {_names(allowed)}. "
            "Convert the tensor first (e.g. tensor.to(torch.float32)).")
    return CORE_DTYPES[tensor.dtype]
