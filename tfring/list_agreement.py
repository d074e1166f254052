# Ranks agree on the length of a list before its collectives run.
#
# Why: broadcast_variables() and the grouped collectives match the i-th
# tensor of every rank by position. When one rank's list is longer (a model
# with an extra layer, an optimizer built on some ranks only), the tensors
# pair up wrongly and the first error the user would see is a dtype or shape
# mismatch between unrelated variables (or a stall, for the extra ones),
# which points the wrong way. So, eagerly, the ranks first exchange their
# list lengths (one small allgather) and, when they differ, every rank
# raises an error that says so. Inside tf.function no value can be
# exchanged while tracing; those calls are not checked.

import numpy as np
import tensorflow as tf

# The op itself, not tfring.allgather(): collectives.py checks its grouped
# calls here, and the arguments below need no checking.
from tfring import ops as _ops
from tfring import list_lengths as _lengths


def check_same_length(items, noun, verb, api_name, membership, name=None):
    """Raises ValueError on every rank of `membership` unless all of them
    pass lists of len(items). Eager only; does nothing in a graph.

    `name`: the checked call's own name. Its exchange is named after it, so
    that named calls may run in any order on each rank (from threads, say)
    as the calls themselves may; an unnamed call's exchange is unnamed too,
    positional like the call."""
    if not tf.executing_eagerly() or membership.size < 2:
        return
    mine = np.array([len(items)], dtype=np.int64)
    lengths = _ops.allgather_op(
        tf.constant(mine), name=None if name is None else f"{name}.list_length",
        process_set_id=membership.id).numpy()
    _lengths.raise_unless_equal(
        lengths, membership.ranks, noun, verb, api_name,
        "Build the same model on every rank (and the optimizer too, e.g. "
        "optimizer.build(model.trainable_variables)) before broadcasting or "
        "reducing.")


def check_same_length_once(key, items, noun, verb, api_name, membership, name=None):
    """check_same_length() on the first eager call for `key` only."""
    if not tf.executing_eagerly() or not _lengths.needs_check(key):
        return
    check_same_length(items, noun, verb, api_name, membership, name)
    _lengths.mark_checked(key)
