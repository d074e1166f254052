# What the ranks are told when their lists differ in length, for every
# front end.
#
# Why a module of its own: grouped collectives and broadcasts of variable or
# parameter lists match the i-th tensor of every rank by position, so the
# ranks first exchange their list lengths (each front end with its own
# collective: tfring/list_agreement.py for TensorFlow, tfring/torch for
# PyTorch). The error, and which calls are checked, are the same for all.

# Grouped collectives run every step: each (api, name, process set) is
# checked on its first call only, the same call on every rank. A program
# that names its calls differently every step would pay one more exchange
# per call and grow this set without end: past this many names, new ones
# are not checked (on every rank alike, as they make the same calls).
_checked_calls = set()
_MOST_CHECKED_CALLS = 4096


def needs_check(key):
    """Whether the call `key` has yet to be checked (and may still be)."""
    return key not in _checked_calls and len(_checked_calls) < _MOST_CHECKED_CALLS


def mark_checked(key):
    _checked_calls.add(key)


def _third_person(verb):
    return verb + "es" if verb.endswith(("s", "sh", "ch")) else verb + "s"


def describe_lengths(lengths, ranks, noun, verb):
    """"rank 0 passes 2 tensors, ranks 1, 2 pass 3 tensors"."""
    by_length = {}
    for rank, length in zip(ranks, lengths):
        by_length.setdefault(int(length), []).append(rank)
    parts = []
    for length, holders in sorted(by_length.items(), key=lambda kv: kv[1][0]):
        who = (f"rank {holders[0]} {_third_person(verb)}" if len(holders) == 1
               else f"ranks {', '.join(map(str, holders))} {verb}")
        parts.append(f"{who} {length} {noun if length != 1 else noun[:-1]}")
    return ", ".join(parts)


def raise_unless_equal(lengths, ranks, noun, verb, api_name, build_advice):
    """Raises the ValueError every rank sees when `lengths` (one per rank of
    `ranks`) differ. `build_advice` says how to build the same lists."""
    lengths = [int(n) for n in lengths]
    if all(n == lengths[0] for n in lengths):
        return
    raise ValueError(
        f"{api_name}: the ranks pass lists of different lengths: "
        f"{describe_lengths(lengths, ranks, noun, verb)}. "
        f"Expected the same {noun}, in the same order, on every rank: they "
        "are matched by position. This usually means the ranks built "
        "different models (a layer, or optimizer state, that exists on "
        f"some ranks only). {build_advice}")
