# Process sets: subsets of the job's ranks that run collectives among
# themselves, with horovod.common.process_sets' names and semantics.
#
# Why this module: the core owns the table of sets (id -> job ranks) and runs
# each set's collectives; Python hands out ProcessSet objects that users pass
# as `process_set=` and that tfring.init() / add_process_set() fill in. This
# is the one place that turns such an object into the id an op carries, and
# it checks, before any C++ runs, what one rank can get wrong alone: an
# object that was never registered or was removed (ValueError naming it), a
# set this rank is not in (tf.errors.InvalidArgumentError: its collectives
# would wait forever for this rank's peers). Ranks are always job ranks
# (tfring.rank()), never positions within a set.
#
# The module keeps a copy of the core's table, refreshed after every change
# (init, add, remove, shutdown), so that checking a set costs a dict lookup.

import numbers
import os

from tfring import _core
from tfring import _running

# Read here rather than in the core (cc/config.h lists it with the knobs):
# dynamic process sets are decided by init()'s arguments, which Python
# checks.
HOROVOD_DYNAMIC_PROCESS_SETS = "HOROVOD_DYNAMIC_PROCESS_SETS"

_state = {
    # id -> tuple of sorted job ranks, as the core reported them last.
    "table": {},
    # Whether init() was called with process_sets="dynamic".
    "dynamic": False,
}


class ProcessSet:
    """A set of ranks that run collectives together.

    Build it from a list of job ranks (`tfring.rank()` values; kept sorted)
    or from an mpi4py communicator (its members, translated to job ranks when
    the set is registered), then register it: pass it to
    `tfring.init(process_sets=[...])`, or to `tfring.add_process_set()` in a
    job started with `process_sets="dynamic"`. Registration sets
    `process_set_id`; pass the object as `process_set=` to any collective.

    Attributes:
      process_set_id: the core's id of the set (0 for the global set), or
        None while the set is not registered (never, or removed since).
      ranks: the job ranks in the set, sorted (None for a set built from a
        communicator until it is registered).
      mpi_comm: the communicator it was built from, or None.
    """

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        if _is_communicator(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            return
        if isinstance(ranks_or_comm, (str, bytes)) or not _is_iterable(
                ranks_or_comm):
            raise TypeError(
                f"tfring.ProcessSet() received {ranks_or_comm!r} of type "
                f"{type(ranks_or_comm).__name__}. Expected a list of job "
                "ranks (tfring.rank() values) or an mpi4py communicator. "
                "Pass e.g. tfring.ProcessSet([0, 1]).")
        self.ranks = _checked_ranks(list(ranks_or_comm), "tfring.ProcessSet()")

    def size(self):
        """The number of ranks in the set; None while not registered."""
        if self.process_set_id is None:
            return None
        return len(_registered_ranks(self, "ProcessSet.size()"))

    def rank(self):
        """This process's position in the set (0 for its lowest job rank);
        None while not registered.

        Collectives take job ranks (root_rank=tfring.rank() values), not
        these positions; use this to index the results of allgather, which
        are in this order.

        Raises:
          ValueError: this process is not in the set.
        """
        if self.process_set_id is None:
            return None
        ranks = _registered_ranks(self, "ProcessSet.rank()")
        me = _running.rank()
        if me not in ranks:
            raise ValueError(
                f"ProcessSet.rank() was called on rank {me}, which is not in "
                f"{self}. Expected a set that contains this rank. Check "
                "ProcessSet.included() first.")
        return ranks.index(me)

    def included(self):
        """Whether this process is in the set; None while its ranks are not
        known (a set built from a communicator, before registration)."""
        if self.ranks is None:
            return None
        return _running.rank() in self.ranks

    def _invalidate(self):
        self.process_set_id = None

    def __str__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, "
                f"ranks={self.ranks})")

    __repr__ = __str__


def _is_iterable(value):
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _is_communicator(value):
    # Only a value that could be one needs mpi4py (importing it starts MPI).
    if _is_iterable(value) or value is None or isinstance(
            value, (numbers.Number, str, bytes)):
        return False
    from mpi4py import MPI
    return isinstance(value, MPI.Comm)


def _checked_ranks(ranks, api_name, size=None):
    """`ranks` sorted, after checking they are distinct non-negative ints
    (below `size` when given)."""
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral):
            raise TypeError(
                f"{api_name} received ranks {ranks!r} with an entry of type "
                f"{type(r).__name__}. Expected job ranks as ints. Pass e.g. "
                "[0, 1].")
    ranks = sorted(int(r) for r in ranks)
    if len(set(ranks)) != len(ranks):
        raise ValueError(
            f"{api_name} received ranks {ranks} with a rank more than once. "
            "Expected distinct job ranks. Remove the duplicates.")
    bad = [r for r in ranks if r < 0 or (size is not None and r >= size)]
    if bad:
        limit = "" if size is None else f" below tfring.size() == {size}"
        raise ValueError(
            f"{api_name} received ranks {ranks}, of which {bad} are not "
            f"ranks of the job. Expected ranks >= 0{limit}. Pass job ranks "
            "(tfring.rank() values).")
    return ranks


# Every collective's default: all ranks of the job. Its ranks are filled in
# by init().
global_process_set = ProcessSet([])
"""The process set of every rank of the job (id 0): every collective's default."""
global_process_set.process_set_id = 0


def _not_registered_error(process_set, api_name):
    if process_set.process_set_id is None:
        what = ("is not registered (it was never passed to tfring.init("
                "process_sets=[...]) or tfring.add_process_set(), or it was "
                "removed by tfring.remove_process_set())")
    else:
        what = ("does not exist in this job (it was removed, or it belongs "
                "to a job that was shut down)")
    known = sorted(_state["table"])
    return ValueError(
        f"{api_name} received {process_set}, which {what}. Expected a "
        f"registered process set (ids now: {known}). Register it with "
        "tfring.init(process_sets=[...]) or tfring.add_process_set(), or use "
        "tfring.global_process_set.")


def _registered_ranks(process_set, api_name):
    """The set's job ranks as the core knows them; ValueError if it is not
    registered in the running job."""
    _running.check_initialized(api_name)
    ranks = _state["table"].get(process_set.process_set_id)
    if (ranks is None or (process_set.process_set_id != 0
                          and process_set.ranks is not None
                          and list(ranks) != process_set.ranks)):
        raise _not_registered_error(process_set, api_name)
    return list(ranks)


class Membership:
    """A checked process set: its id and job ranks, and whether this rank is
    in it (always, unless resolve() was asked to accept a set without it)."""

    __slots__ = ("process_set", "id", "ranks", "included")

    def __init__(self, process_set, process_set_id, ranks, included=True):
        self.process_set = process_set
        self.id = process_set_id
        self.ranks = ranks
        self.included = included

    @property
    def size(self):
        return len(self.ranks)

    @property
    def key(self):
        """What distinguishes this set in caches of traced functions."""
        return (self.id, self.ranks)


def resolve(process_set, api_name, allow_outside=False):
    """Checks `process_set` for a collective of `api_name` on this rank.

    With `allow_outside`, a registered set without this rank is accepted
    (Membership.included is then False): the gradient reducers return such
    a rank's own gradients, as Horovod's do, so the same training code runs
    on every rank.

    Returns:
      A Membership (id, ranks, included).

    Raises:
      TypeError: not a tfring.ProcessSet.
      ValueError: not initialized, or a set that is not registered.
      tf.errors.InvalidArgumentError: this rank is not in the set (unless
        `allow_outside`).
    """
    if not isinstance(process_set, ProcessSet):
        raise TypeError(
            f"{api_name} received process_set={process_set!r} of type "
            f"{type(process_set).__name__}. Expected a tfring.ProcessSet "
            "registered with tfring.init(process_sets=[...]) or "
            "tfring.add_process_set(), or tfring.global_process_set (the "
            "default). Pass one of those.")
    ranks = tuple(_registered_ranks(process_set, api_name))
    if process_set.process_set_id != 0:
        me = _running.rank()
        if me not in ranks and allow_outside:
            return Membership(process_set, process_set.process_set_id, ranks,
                              included=False)
        if me not in ranks:
            # TensorFlow's error for TensorFlow's collectives; imported here
            # so that tfring.torch, which passes allow_outside, never loads
            # TensorFlow.
            import tensorflow as tf
            raise tf.errors.InvalidArgumentError(
                None, None,
                f"{api_name} was called on rank {me} with process_set="
                f"{process_set}, which does not contain rank {me}. Only the "
                "ranks of a set take part in its collectives (the others "
                "would wait forever for this rank). Expected a set that "
                f"contains rank {me}. Call it only where "
                "process_set.included() is True, or pass a set that includes "
                "this rank.")
    return Membership(process_set, process_set.process_set_id, ranks)


# --- registration: init(), add_process_set(), remove_process_set() -------


def _refresh_table():
    _state["table"] = {int(k): tuple(v)
                       for k, v in _core.process_sets().items()}
    global_process_set.ranks = list(_state["table"].get(0, ()))


def _communicator_ranks(comm, job_comm, MPI):
    """The job ranks of `comm`'s members, or a problem as a string."""
    if comm == MPI.COMM_NULL:
        return None
    if comm.Is_inter():
        return "an intercommunicator"
    group, job_group = comm.Get_group(), job_comm.Get_group()
    try:
        translated = MPI.Group.Translate_ranks(
            group, list(range(group.Get_size())), job_group)
    finally:
        group.Free()
        job_group.Free()
    if any(r == MPI.UNDEFINED for r in translated):
        return "a communicator with processes outside the job"
    return tuple(sorted(int(r) for r in translated))


def prepare_init(process_sets, job_comm):
    """Validates init()'s `process_sets` and works out the sets to create.

    Runs before the core starts, on every rank of `job_comm`, and exchanges
    every rank's view once (over a duplicate of `job_comm`), so that every
    rank raises the same error for arguments that differ between ranks
    instead of some waiting for the others. A set built from a communicator
    is the communicator of each rank, so it can stand for several sets (a
    Split into {0, 1} and {2, 3} makes both).

    Returns:
      (ranks_lists, dynamic, finish): the sets for the core, in order (ids
      1, 2, ...), whether sets may be added later, and finish(), to call
      once the core runs, which fills in the ProcessSet objects.
    """
    from mpi4py import MPI

    api_name = "tfring.init()"
    if process_sets is None:
        process_sets = []
    dynamic = _dynamic_from_environment()
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(
                f"{api_name} received process_sets={process_sets!r}. "
                "Expected a list of tfring.ProcessSet or the string "
                "'dynamic'. Pass one of those.")
        process_sets, dynamic = [], True
    if not isinstance(process_sets, (list, tuple)):
        raise TypeError(
            f"{api_name} received process_sets of type "
            f"{type(process_sets).__name__}. Expected a list of "
            "tfring.ProcessSet, 'dynamic' or None. Pass e.g. "
            "process_sets=[tfring.ProcessSet([0, 1])].")
    process_sets = list(process_sets)
    for i, ps in enumerate(process_sets):
        if not isinstance(ps, ProcessSet):
            raise TypeError(
                f"{api_name} received process_sets entry {i} {ps!r} of type "
                f"{type(ps).__name__}. Expected tfring.ProcessSet objects "
                "(keep them: collectives take them as process_set=). Pass "
                f"e.g. tfring.ProcessSet({ps!r}).")
        if ps is global_process_set:
            raise ValueError(
                f"{api_name} received tfring.global_process_set in "
                "process_sets. Expected only additional sets: the global "
                "set always exists. Remove it from the list.")
    size = job_comm.Get_size()
    if not process_sets:
        return [], dynamic, lambda: _finish_init([], [], dynamic)

    # Every rank's view: each entry's kind and rank list, and for
    # communicator entries this rank's communicator's members in job ranks
    # (or what is wrong with it).
    # (A set from a communicator is looked up again at every init(): its
    # ranks from an earlier job may not be this job's.)
    mine = [("comm", None) if ps.mpi_comm is not None
            else ("ranks", tuple(ps.ranks)) for ps in process_sets]
    comm_ranks = [
        _communicator_ranks(ps.mpi_comm, job_comm, MPI)
        if ps.mpi_comm is not None else None for ps in process_sets]
    scratch = job_comm.Dup()  # never matches the user's traffic on job_comm
    try:
        views = scratch.allgather((mine, comm_ranks))
    finally:
        scratch.Free()

    entries_by_rank = [v[0] for v in views]
    if any(e != entries_by_rank[0] for e in entries_by_rank):
        raise ValueError(
            f"{api_name} received different process_sets on different "
            f"ranks ({_describe_views(entries_by_rank)}). Expected the same "
            "list, in the same order, on every rank (a set built from a "
            "communicator may differ). Build process_sets the same way on "
            "every rank.")

    ranks_lists = []   # for the core, in id order
    per_entry = []     # for each entry: the ranks of this rank's object
    for i, (kind, ranks) in enumerate(mine):
        if kind == "ranks":
            checked = _checked_ranks(list(ranks), f"{api_name} process_sets "
                                     f"entry {i}", size)
            candidates = [tuple(checked)]
        else:
            problems = {r: v[1][i] for r, v in enumerate(views)
                        if isinstance(v[1][i], str)}
            if problems:
                raise ValueError(
                    f"{api_name} received in process_sets entry {i} a "
                    "ProcessSet built from a communicator that is "
                    + "; ".join(f"{p} on rank {r}"
                                for r, p in sorted(problems.items()))
                    + ". Expected an intracommunicator of processes of the "
                    "job (e.g. from comm.Split()). Pass such a communicator "
                    "on every rank.")
            candidates = sorted({v[1][i] for v in views
                                 if v[1][i] is not None})
            if not candidates:
                raise ValueError(
                    f"{api_name} received in process_sets entry {i} a "
                    "ProcessSet built from MPI.COMM_NULL on every rank. "
                    "Expected a communicator with members. Pass the "
                    "communicator returned by comm.Split() on its members.")
            null_ranks = [r for r, v in enumerate(views) if v[1][i] is None]
            if null_ranks and len(candidates) > 1:
                raise ValueError(
                    f"{api_name} received in process_sets entry {i} a "
                    "ProcessSet built from MPI.COMM_NULL on rank(s) "
                    f"{null_ranks} while the other ranks' communicators "
                    f"form several sets {[list(c) for c in candidates]}, "
                    "so it cannot tell which one their object stands for. "
                    "Expected a communicator on every rank, or "
                    "MPI.COMM_NULL only where the others form one set. Give "
                    "every rank a color in comm.Split().")
        for ranks in candidates:
            if not ranks:
                raise ValueError(
                    f"{api_name} received an empty ProcessSet in "
                    f"process_sets entry {i}. Expected at least one rank. "
                    "Remove it.")
            if list(ranks) == list(range(size)):
                raise ValueError(
                    f"{api_name} received in process_sets entry {i} "
                    f"{process_sets[i]} with every rank of the job "
                    f"({list(ranks)}), the same ranks as the global set. "
                    "Expected a set that differs from every other. Use "
                    "tfring.global_process_set instead.")
            if ranks in ranks_lists:
                raise ValueError(
                    f"{api_name} received process_sets entry {i} "
                    f"{process_sets[i]} with ranks {list(ranks)}, which an "
                    "earlier entry already has. Expected each set once "
                    "(duplicates are not allowed). Remove the duplicate, "
                    "or reuse the first object.")
            ranks_lists.append(ranks)
        if kind == "ranks":
            per_entry.append(candidates[0])
        else:
            own = comm_ranks[i]
            per_entry.append(own if own is not None else candidates[0])

    ranks_lists = [list(r) for r in ranks_lists]
    return (ranks_lists, dynamic,
            lambda: _finish_init(process_sets, per_entry, dynamic))


def _dynamic_from_environment():
    """Horovod's HOROVOD_DYNAMIC_PROCESS_SETS: an integer above 0 starts
    the job with dynamic process sets, as process_sets="dynamic" does (and
    with the sets listed in process_sets too, as in Horovod). Anything else
    leaves them off."""
    value = os.environ.get(HOROVOD_DYNAMIC_PROCESS_SETS, "").strip()
    try:
        return int(value) > 0
    except ValueError:
        return False


def _describe_views(entries_by_rank):
    by_view = {}
    for rank, entries in enumerate(entries_by_rank):
        shown = [list(r) if kind == "ranks" else "communicator"
                 for kind, r in entries]
        by_view.setdefault(repr(shown), []).append(rank)
    return "; ".join(f"ranks {ranks}: {view}"
                     for view, ranks in by_view.items())


def _finish_init(process_sets, per_entry_ranks, dynamic):
    """After the core started: fill in the objects passed to init()."""
    _state["dynamic"] = dynamic
    _refresh_table()
    id_of = {ranks: ps_id for ps_id, ranks in _state["table"].items()}
    for ps, ranks in zip(process_sets, per_entry_ranks):
        ps.ranks = list(ranks)
        ps.process_set_id = id_of.get(tuple(ranks))


def on_shutdown():
    """The core stopped: no set exists any more."""
    _state["table"] = {}
    _state["dynamic"] = False


def _check_dynamic(api_name, verb):
    if not _state["dynamic"]:
        raise ValueError(
            f"{api_name} was called, but tfring was initialized without "
            f"dynamic process sets, so sets cannot be {verb} while it runs. "
            "Expected tfring.init(process_sets='dynamic') (or "
            "HOROVOD_DYNAMIC_PROCESS_SETS=1 in the environment before "
            "init()). Start tfring that way, or pass the sets to "
            "tfring.init(process_sets=[...]).")


def add_process_set(process_set):
    """Registers a new process set while tfring runs; returns it.

    Collective over every rank of the job: every rank must call it with the
    same ranks, also ranks outside the set. Needs
    tfring.init(process_sets="dynamic").

    Args:
      process_set: a tfring.ProcessSet built from a list of ranks, or the
        list of job ranks itself.

    Returns:
      The ProcessSet, with process_set_id set.

    Raises:
      ValueError: tfring was not started with dynamic process sets, a set
        with these ranks exists already, or the ranks are not job ranks.
      NotImplementedError: a ProcessSet built from a communicator (as in
        Horovod; build it from a list of ranks).
    """
    api_name = "tfring.add_process_set()"
    _running.check_initialized(api_name)
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError(
            f"{api_name} received a ProcessSet built from an mpi4py "
            "communicator. Adding such a set while tfring runs is not "
            "implemented (as in Horovod): each rank's communicator may hold "
            "different ranks. Build it from a list of job ranks instead, "
            "e.g. tfring.add_process_set([0, 1]).")
    _check_dynamic(api_name, "added")
    ranks = _checked_ranks(process_set.ranks, api_name, _running.size())
    if not ranks:
        raise ValueError(
            f"{api_name} received an empty set of ranks. Expected at least "
            "one job rank. Pass e.g. [0, 1].")
    for ps_id, existing in sorted(_state["table"].items()):
        if list(existing) == ranks:
            raise ValueError(
                f"{api_name} received {process_set}, a duplicate of the "
                f"existing process set {ps_id} with ranks {ranks}. Expected "
                "ranks that no set has yet. Reuse the existing set "
                + ("(tfring.global_process_set)." if ps_id == 0 else
                   "or remove it first with tfring.remove_process_set()."))
    new_id = _core.add_process_set(ranks)
    _refresh_table()
    process_set.ranks = ranks
    process_set.process_set_id = int(new_id)
    return process_set


def remove_process_set(process_set):
    """Removes a process set added before; returns whether it was removed.

    Collective over every rank of the job, like add_process_set(). Returns
    False (and changes nothing) for the global set and for a set that is not
    registered. On success the object is invalidated (process_set_id
    None): later collectives with it raise ValueError.
    """
    api_name = "tfring.remove_process_set()"
    if not isinstance(process_set, ProcessSet):
        raise TypeError(
            f"{api_name} received {process_set!r} of type "
            f"{type(process_set).__name__}. Expected the tfring.ProcessSet "
            "that add_process_set() or init() registered. Pass that object.")
    _running.check_initialized(api_name)
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0:
        return False
    _check_dynamic(api_name, "removed")
    if ps_id not in _state["table"]:
        process_set._invalidate()
        return False
    _core.remove_process_set(ps_id)
    process_set._invalidate()
    _refresh_table()
    return True
