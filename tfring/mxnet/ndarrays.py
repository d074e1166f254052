# How an MXNet NDArray's memory reaches the core, and in what order with
# MXNet's asynchronous engine.
#
# Why: nothing in tfring is compiled against MXNet. An NDArray's data pointer
# comes from MXNet's own C API (MXNDArrayGetData on arr.handle, through the
# libmxnet MXNet loaded: mxnet.base._LIB). MXNet computes asynchronously, so
# an input is waited for (wait_to_read: every pending write done) and an
# output the core writes is waited for until no MXNet operation reads or
# writes it (MXNDArrayWaitToWrite); the collective then completes before the
# call returns to MXNet code, so MXNet never reads an output the core is
# still writing. The alternative, pushing the collective into MXNet's engine
# (MXEnginePushAsync with read/write dependencies), would let Python return
# before the data is ready, but calls back into Python on an engine thread;
# a training step waits for its gradients before the update anyway, and the
# trainer submits them all before waiting for any (trainer.py).

import ctypes

import mxnet as mx
import numpy as np

from tfring import _core

_NAMES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32",
          "float64", "bool")
CORE_DTYPES = {np.dtype(name): _core.DataType.__members__[name] for name in _NAMES}
REDUCIBLE_DTYPES = frozenset(d for d, core in CORE_DTYPES.items() if _core.reducible(core))

# From this size on, an output's fresh memory is advised onto huge pages
# before the collective first writes it (as tfring.torch does).
_HUGE_PAGES_FROM_BYTES = 2 << 20


def _names(dtypes):
    return ", ".join(sorted(d.name for d in dtypes))


def check_array(array, api_name, reduction=False):
    """The core DataType of `array` after checking that the core can use its
    memory: a dense CPU NDArray of a supported dtype."""
    if not isinstance(array, mx.nd.NDArray):
        raise TypeError(
            f"{api_name} received {type(array).__name__} {array!r:.80}. "
            "Expected an mxnet.nd.NDArray. Pass an NDArray (e.g. mx.nd.array(x)).")
    if array.context.device_type != "cpu":
        raise ValueError(
            f"{api_name} received an NDArray on context {array.context}. "
            "tfring.mxnet runs collectives on CPU NDArrays only; GPU contexts "
            "are not supported. Copy the array to the CPU first "
            "(array.as_in_context(mx.cpu())) and the result back.")
    if array.stype != "default":
        raise ValueError(
            f"{api_name} received an NDArray of storage type '{array.stype}'. "
            "Expected a dense NDArray (stype 'default'). Pass array.tostype('default').")
    dtype = np.dtype(array.dtype)
    allowed = REDUCIBLE_DTYPES if reduction else frozenset(CORE_DTYPES)
    if dtype not in allowed:
        kind = "reduce" if reduction else "move"
        raise ValueError(
            f"{api_name} received an NDArray of dtype {dtype.name}, which tfring "
            f"cannot {kind}. Expected one of: {_names(allowed)}. Convert the "
            "array first (e.g. array.astype('float32')).")
    return CORE_DTYPES[dtype]


def address(array):
    """The address of `array`'s first element (MXNet allocates it now if it
    was created lazily)."""
    pointer = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    return pointer.value or 0


def ready_to_read(array):
    """Blocks until MXNet has finished every pending write of `array`."""
    array.wait_to_read()


def ready_to_write(array):
    """Blocks until no pending MXNet operation reads or writes `array`."""
    mx.base.check_call(mx.base._LIB.MXNDArrayWaitToWrite(array.handle))


def new_output(like):
    """A new NDArray of `like`'s shape and dtype on the CPU, for a collective
    to write into."""
    output = mx.nd.empty(like.shape, ctx=mx.cpu(), dtype=like.dtype)
    num_bytes = output.size * np.dtype(output.dtype).itemsize
    if num_bytes >= _HUGE_PAGES_FROM_BYTES:
        _core.advise_huge_pages(address(output), num_bytes)
    return output


def from_core_output(pending, dtype):
    """A new NDArray holding the output the core allocated for `pending`
    (allgather, alltoall, reducescatter)."""
    shape = tuple(pending.output_shape())
    buffer = pending.output()
    dtype = np.dtype(dtype)
    if buffer is None or len(buffer) == 0:
        return mx.nd.zeros(shape, ctx=mx.cpu(), dtype=dtype)
    values = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    return mx.nd.array(values, ctx=mx.cpu(), dtype=dtype)


def from_numpy(values, dtype=None):
    return mx.nd.array(values, ctx=mx.cpu(), dtype=dtype if dtype is not None else values.dtype)
