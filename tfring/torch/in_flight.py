# The memory that collectives in flight read and write, and what may not
# happen to it until they complete.
#
# Why: the core reads a tensor's memory and writes the result into it on its
# background thread, after the call that submitted it has returned. Holding
# the tensor is not enough to keep that memory valid: `t.set_(...)` gives the
# tensor other memory, and `t.resize_(...)` (or a resize of its storage, or
# of any view of it) frees the old block when it grows it. Either, while the
# core is still using the block, meant a write into freed memory: a crash,
# or a silent corruption of another allocation. So a Flight keeps the
# storages themselves alive until the core is done, and tfring.torch refuses
# the Python calls that would take a storage's memory away while a flight
# uses it (resize_, resize_as_, set_ on a tensor; resize_ on a storage),
# with an error that names the collective. Dropping a handle without
# synchronize() neither blocks nor frees anything early: the flight is kept
# here until the core completes it.

import torch

_flights_by_storage = {}  # storage address -> list of Flights using it
_orphans = []  # Flights whose Handle was dropped before they completed


class Flight:
    """The core's PendingCollectives of one call and everything whose memory
    they use; registered while the core may still touch that memory."""

    __slots__ = ("pending", "names", "_keep_alive", "_storages",
                 "_addresses", "_released")

    def __init__(self, pending, names, tensors):
        self.pending = list(pending)
        self.names = list(names)
        self._keep_alive = tensors
        self._storages = []
        self._addresses = []
        for tensor in tensors:
            storage = tensor.untyped_storage()
            address = storage.data_ptr()
            if address == 0 or address in self._addresses:
                continue  # an empty tensor: the core touches no memory
            self._storages.append(storage)
            self._addresses.append(address)
            _flights_by_storage.setdefault(address, []).append(self)
        self._released = False

    def done(self):
        return all(p.done() for p in self.pending)

    def release(self):
        """Forgets the memory; only once the core has completed every part."""
        if self._released:
            return
        self._released = True
        for address in self._addresses:
            flights = _flights_by_storage.get(address)
            if flights is not None:
                flights.remove(self)
                if not flights:
                    del _flights_by_storage[address]
        self._keep_alive = self._storages = None


def orphan(flight):
    """Keeps `flight` (a dropped handle's) until the core completes it."""
    if flight.done():
        flight.release()
    else:
        _orphans.append(flight)


def prune_orphans():
    """Releases the dropped handles' flights that have completed (called
    at every submission, so they do not accumulate)."""
    if _orphans:
        still = [f for f in _orphans if not f.done()]
        for flight in _orphans:
            if flight not in still:
                flight.release()
        _orphans[:] = still


def check_memory_kept(tensor, api_name):
    """Raises if a collective in flight uses `tensor`'s storage."""
    if not _flights_by_storage:
        return
    address = tensor.untyped_storage().data_ptr()
    _refuse_if_used(address, api_name)


def _refuse_if_used(address, api_name):
    flights = _flights_by_storage.get(address)
    if not flights:
        return
    busy = [f for f in flights if not f.done()]
    if not busy:
        return
    names = ", ".join(repr(n) for f in busy for n in f.names[:3])
    raise RuntimeError(
        f"{api_name} was called on a tensor whose memory a collective in "
        f"flight is still using ({names}). Changing its memory now would "
        "let the collective read or write memory that was freed. Expected "
        "the collective to complete first: call hvd.synchronize(handle) "
        "(or optimizer.synchronize()/step()) before resizing or re-pointing "
        "the tensor.")


def _guard_tensor_method(name):
    original = getattr(torch.Tensor, name)

    def guarded(self, *args, **kwargs):
        if _flights_by_storage:
            check_memory_kept(self, f"Tensor.{name}()")
        return original(self, *args, **kwargs)

    guarded.__name__ = name
    guarded.__qualname__ = f"Tensor.{name}"
    guarded.__doc__ = original.__doc__
    guarded.__wrapped__ = original
    setattr(torch.Tensor, name, guarded)


def _guard_storage_resize():
    original = torch.UntypedStorage.resize_

    def resize_(self, *args, **kwargs):
        if _flights_by_storage:
            _refuse_if_used(self.data_ptr(), "UntypedStorage.resize_()")
        return original(self, *args, **kwargs)

    resize_.__doc__ = original.__doc__
    resize_.__wrapped__ = original
    torch.UntypedStorage.resize_ = resize_


def install_guards():
    """Makes resize_, resize_as_ and set_ check for flights (once)."""
    if getattr(torch.Tensor.set_, "__wrapped__", None) is not None:
        return
    for name in ("resize_", "resize_as_", "set_"):
        _guard_tensor_method(name)
    _guard_storage_resize()


install_guards()
