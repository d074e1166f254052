# Handles of asynchronous collectives: poll() and synchronize().
#
# Why: the core reads and writes a tensor's memory on its background thread
# after the call that submitted it has returned. A Handle holds the call's
# Flight (tfring.torch.in_flight: the core's PendingCollective objects, one
# per tensor, several for grouped calls, and the storages they use) until
# synchronize(). Waiting happens in C++ without the GIL; turning the outcome
# into the result (or into HorovodInternalError) happens here, once. As in
# Horovod, a handle dropped without synchronize() never blocks: its flight
# stays alive until the core completes it.

import torch

from tfring import _core
from tfring.common import outcome as _outcome
from tfring.torch import in_flight as _in_flight
from tfring.torch.errors import HorovodInternalError


class Handle:
    """An asynchronous collective in flight: pass it to synchronize() for the
    result, or to poll() to ask whether it has completed."""

    __slots__ = ("_flight", "_finish", "_synchronized", "_written")

    def __init__(self, flight, finish, written=()):
        # flight: an in_flight.Flight; finish(pending) -> the result, called
        # once all completed successfully; written: (tensor, address) of
        # the caller's tensors the core writes, checked at the end.
        self._flight = flight
        self._finish = finish
        self._synchronized = False
        self._written = written

    def done(self):
        return self._flight is None or self._flight.done()

    def wait(self):
        """Blocks until every tensor's collective completed; returns the
        result, or raises HorovodInternalError with the first failure."""
        flight = self._flight
        try:
            _outcome.wait_all(flight.pending)
        except HorovodInternalError:
            self._waited(flight)  # every part completed, some failed
            raise
        self._waited(flight)
        _check_still_written(self._written, flight.names)
        return self._finish(flight.pending)

    def _waited(self, flight):
        """The core has completed every part: the memory is free."""
        self._synchronized = True
        self._flight = None
        flight.release()

    def __del__(self):
        # Dropped unsynchronized: keep the memory until the core is done.
        flight = getattr(self, "_flight", None)
        if flight is not None:
            _in_flight.orphan(flight)


def _check_still_written(written, names):
    for tensor, address in written:
        if tensor.data_ptr() != address:
            raise HorovodInternalError(
                f"The result of {names[0]!r} was written into memory its "
                "tensor no longer uses: the tensor was given other memory "
                "(an out= operation or a C++ extension resized it) while the "
                "collective was in flight. Expected the tensor to keep its "
                "memory until synchronize(). Synchronize before reusing the "
                "tensor as an output.")


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


# From this size on, a new output's memory is advised onto huge pages: the
# collective is the first to write it, and faulting a fresh block in 4 KiB
# at a time costs more than the collective (see AdviseHugePages in
# tfring/binding/buffer_collectives.h).
_HUGE_PAGES_FROM_BYTES = 2 << 20


def new_output(like):
    """An uninitialised tensor of `like`'s shape, dtype and memory layout
    (an ordinary torch tensor: resizable, owned by torch), for a collective
    to write into."""
    output = torch.empty_like(like, memory_format=torch.preserve_format)
    num_bytes = output.numel() * output.element_size()
    if num_bytes >= _HUGE_PAGES_FROM_BYTES:
        _core.advise_huge_pages(output.data_ptr(), num_bytes)
    return output


def output_tensor(pending, dtype):
    """The tensor the core allocated for `pending` (allgather, alltoall,
    reducescatter), viewed without a copy; it owns the core's buffer."""
    shape = list(pending.output_shape())
    buffer = pending.output()
    if buffer is None or len(buffer) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
