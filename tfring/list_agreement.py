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

# Grouped collectives run every step: each (api, name, process set) is
# checked on its first eager call only, the same call on every rank. A
# program that names its calls differently every step would pay one more
# exchange per call and grow this set without end: past this many names,
# new ones are not checked (on every rank alike, as they make the same calls).
_checked_grouped_calls = set()
_MOST_CHECKED_CALLS = 4096


def _third_person(verb):
    return verb + "es" if verb.endswith(("s", "sh", "ch")) else verb + "s"


def _describe_lengths(lengths, ranks, noun, verb):
    by_length = {}
    for rank, length in zip(ranks, lengths):
        by_length.setdefault(int(length), []).append(rank)
    parts = []
    for length, holders in sorted(by_length.items(), key=lambda kv: kv[1][0]):
        who = (f"rank {holders[0]} {_third_person(verb)}" if len(holders) == 1
               else f"ranks {', '.join(map(str, holders))} {verb}")
        parts.append(f"{who} {length} {noun if length != 1 else noun[:-1]}")
    return ", ".join(parts)


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
    if np.all(lengths == lengths[0]):
        return
    raise ValueError(
        f"{api_name}: the ranks pass lists of different lengths: "
        f"{_describe_lengths(lengths, membership.ranks, noun, verb)}. "
        f"Expected the same {noun}, in the same order, on every rank: they "
        "are matched by position. This usually means the ranks built "
        "different models (a layer, or optimizer state, that exists on "
        "some ranks only). Build the same model on every rank (and the "
        "optimizer too, e.g. optimizer.build(model.trainable_variables)) "
        "before broadcasting or reducing.")


def check_same_length_once(key, items, noun, verb, api_name, membership, name=None):
    """check_same_length() on the first eager call for `key` only."""
    if (not tf.executing_eagerly() or key in _checked_grouped_calls
            or len(_checked_grouped_calls) >= _MOST_CHECKED_CALLS):
        return
    check_same_length(items, noun, verb, api_name, membership, name)
    _checked_grouped_calls.add(key)
