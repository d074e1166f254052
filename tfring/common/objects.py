# Python objects through byte collectives: pickled (cloudpickle, as Horovod
# does) into bytes that any front end moves as a uint8 tensor.
#
# Why shared: broadcast_object and allgather_object differ between front
# ends only in the tensor type that carries the bytes.

import cloudpickle
import numpy as np


def to_bytes(obj):
    """`obj` pickled, as a 1-D writable uint8 numpy array."""
    return np.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=np.uint8)


def from_bytes(data):
    """The object pickled in `data` (bytes or a uint8 array)."""
    return cloudpickle.loads(bytes(memoryview(np.ascontiguousarray(data))))


def split_gathered(sizes, data):
    """The objects of an allgather of pickled bytes: `data` is every rank's
    bytes back to back, `sizes` how many each rank sent."""
    objects, start = [], 0
    for size in sizes:
        size = int(size)
        objects.append(from_bytes(data[start:start + size]))
        start += size
    return objects
