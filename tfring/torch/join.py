# join() for uneven data and barrier(), with horovod.torch's signatures.
#
# Why together: neither moves a tensor of the user's. join() tells the core
# this rank is out of data: it then takes part in the other ranks'
# allreduces with zeros (Average divides by the ranks that contributed)
# until every rank has joined, and returns the last rank to join. barrier()
# is a one-element allreduce every rank of the set must reach.

import collections
import itertools

import torch

from tfring import _core
from tfring import basics
from tfring.process_sets import global_process_set
from tfring.torch import collectives as _c
from tfring.torch.handles import synchronize

_barrier_counts = collections.defaultdict(itertools.count)


def join(device=-1):
    """Blocks until every rank has joined; returns the last rank to join (an
    int, the same on every rank). `device` is accepted for Horovod
    compatibility; join runs on the CPU."""
    del device
    basics._check_initialized("join")
    last = torch.tensor(-1, dtype=torch.int32)
    handle = _c._submit(_core.CollectiveType.join, [_core.JOIN_TENSOR_NAME],
                        [last], [_core.DataType.int32], [last],
                        lambda _: last)
    return int(synchronize(handle))


def barrier(process_set=global_process_set):
    """Returns once every rank of `process_set` has called barrier()."""
    membership = _c._membership(process_set, "barrier")
    count = next(_barrier_counts[membership.id])
    token = torch.zeros(1, dtype=torch.int32)
    _c.allreduce_(token, name=f"barrier.{membership.id}.{count}", op=_c.Sum,
                  process_set=process_set)


def reset_barriers():
    _barrier_counts.clear()
