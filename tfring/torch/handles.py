# Handles of asynchronous collectives: poll(), synchronize(), and the tensors
# an in-flight collective must keep alive.
#
# Why: the core reads and writes a tensor's memory on its background thread
# after the call that submitted it has returned. A Handle holds the core's
# PendingCollective objects (one per tensor; several for grouped calls) and
# references to every tensor involved until the collective completes, so
# their memory cannot be freed or reused under the core. Waiting happens in
# C++ without the GIL; turning the outcome into the result (or into
# HorovodInternalError) happens here, once.

import torch

from tfring import _core
from tfring.torch.errors import HorovodInternalError


class Handle:
    """An asynchronous collective in flight: pass it to synchronize() for the
    result, or to poll() to ask whether it has completed."""

    __slots__ = ("_pending", "_keep_alive", "_finish", "_synchronized")

    def __init__(self, pending, keep_alive, finish):
        # pending: the core's PendingCollective objects; keep_alive: every
        # tensor whose memory the core reads or writes; finish(pending) ->
        # the result, called once all completed successfully.
        self._pending = list(pending)
        self._keep_alive = keep_alive
        self._finish = finish
        self._synchronized = False

    def done(self):
        return all(p.done() for p in self._pending)

    def wait(self):
        """Blocks until every tensor's collective completed; returns the
        result, or raises HorovodInternalError with the first failure."""
        failure = None
        for pending in self._pending:
            code, message = pending.wait()
            if code != _core.StatusCode.OK and failure is None:
                failure = message
        self._synchronized = True
        try:
            if failure is not None:
                raise HorovodInternalError(failure)
            return self._finish(self._pending)
        finally:
            self._keep_alive = None
            self._pending = []

    def __del__(self):
        # Dropped unsynchronized: the core may still be using the tensors,
        # so wait for it before letting them go (never raises).
        for pending in getattr(self, "_pending", ()):
            pending.wait()


def poll(handle):
    """Whether the collective of `handle` has completed, so that
    synchronize(handle) returns without blocking."""
    _check_handle(handle, "poll")
    return handle.done()


def synchronize(handle):
    """Waits for the collective of `handle` and returns its result: the output
    tensor (in-place forms: the input tensor), a list for grouped calls,
    (output, received_splits) for alltoall. As in Horovod, a handle already
    synchronized returns None.

    Raises:
      HorovodInternalError: the collective failed (the message names the
        tensor, what differed and on which ranks).
    """
    _check_handle(handle, "synchronize")
    if handle._synchronized:
        return None
    return handle.wait()


def _check_handle(handle, api_name):
    if not isinstance(handle, Handle):
        raise TypeError(
            f"{api_name}() received {handle!r} of type {type(handle).__name__}."
            " Expected the handle an *_async collective returned (e.g. "
            "hvd.allreduce_async(tensor)). Pass that handle.")


# From this size on, a new output comes from the core's HostBuffer (huge
# pages) rather than torch's allocator, whose fresh large blocks fault in
# 4 KiB at a time while the collective writes them.
_HOST_BUFFER_FROM_BYTES = 2 << 20


def new_output(like):
    """An uninitialised contiguous tensor of `like`'s shape and dtype, for a
    collective to write into."""
    num_bytes = like.numel() * like.element_size()
    if num_bytes < _HOST_BUFFER_FROM_BYTES:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    return torch.frombuffer(_core.HostBuffer(num_bytes), dtype=like.dtype).view(like.shape)


def output_tensor(pending, dtype):
    """The tensor the core allocated for `pending` (allgather, alltoall,
    reducescatter), viewed without a copy; it owns the core's buffer."""
    shape = list(pending.output_shape())
    buffer = pending.output()
    if buffer is None or len(buffer) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
