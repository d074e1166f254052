# Names of the collectives the buffer front ends submit.
#
# Why: ranks match tensors by name. As in Horovod, an explicit name becomes
# "<collective>.<name>"; unnamed calls are numbered in call order
# ("allreduce.noname.<n>"), which matches across ranks that make the same
# calls in the same order. Each kind of call counts its own, per process set
# ("allreduce.noname.set<id>.<n>"), so that calls some ranks do not make (a
# set they are not in, an allgather refused while a rank has joined) do not
# shift the numbers of the others. Each front end owns one CollectiveNames
# and restarts it at init(), so every rank counts from the same point.

import collections
import itertools


class CollectiveNames:
    """The per-(process set, kind) counters of one front end."""

    def __init__(self):
        self._counts = collections.defaultdict(itertools.count)
        self._groups = itertools.count(1)

    def reset(self):
        self._counts.clear()

    def next_group_key(self):
        """A process-unique key for the members of one grouped call."""
        return next(self._groups)

    def name(self, kind, name, api_name, process_set):
        if name is None:
            set_id = getattr(process_set, "process_set_id", None) or 0
            number = next(self._counts[(set_id, kind)])
            if set_id:
                return f"{kind}.noname.set{set_id}.{number}"
            return f"{kind}.noname.{number}"
        if not isinstance(name, str):
            raise TypeError(
                f"{api_name} received name={name!r} of type {type(name).__name__}."
                " Expected a str identical on every rank, or None for an "
                "automatic name. Pass a string.")
        return f"{kind}.{name}"

    def object_call(self, api_name, name, process_set):
        """The base name of an object collective (broadcast_object,
        allgather_object): `name` as given, an unnamed call numbered in call
        order like the unnamed collectives (Horovod names it after the
        object's type, which differs between ranks when only the root passes
        the object, and then hangs)."""
        if name is None:
            return self.name(api_name, None, api_name, process_set)
        return name
