# What elastic training rolls back to and hands to new ranks.
#
# Why: after a failure the survivors go back to the last `commit()` (taken in
# memory, no file), and every rank then receives rank 0's copy, so all go on
# from the same point. These classes follow Horovod's State/ObjectState:
# commit() = save() + check_host_updates(); restore() goes back to the last
# save; sync() makes every rank hold rank 0's state. The framework states
# (TensorFlow, Keras, PyTorch) build on ObjectState, whose commits the first
# rank of each host also writes to that host's disk in an elastic job
# (kept_commit.py), for a job started again after a lost host.

import copy
import queue

from tfring import basics
from tfring.elastic import discovery
from tfring.elastic import kept_commit
from tfring.elastic import membership
from tfring.elastic import settings as _settings
from tfring.elastic.errors import HostsUpdatedInterrupt


def broadcast_object_over_job(obj, root_rank=0):
    """Rank `root_rank`'s `obj` on every rank, pickled over the job's
    communicator (no framework needed)."""
    return membership.current().communicator().bcast(obj, root=root_rank)


def _rank():
    return membership.current().communicator().Get_rank()


class State:
    """The state of a training job that elastic training keeps consistent.

    Subclasses implement save(), restore() and sync(). Callbacks registered
    with register_reset_callbacks() run after every reset (for example to
    rescale the learning rate to the new number of ranks)."""

    def __init__(self, bcast_object=broadcast_object_over_job, get_rank=_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks = []
        # Commits so far (rank 0's count after each sync): which commit kept
        # on a host's disk is the newest.
        self._commits = 0

    def register_reset_callbacks(self, callbacks):
        """Functions called with no arguments after each reset."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, removed_only):
        """Called on rank 0 when the discovered hosts changed."""
        self._host_messages.put((timestamp, removed_only))

    def commit(self):
        """Saves the state in memory (what a failure rolls back to), then
        checks for host changes: HostsUpdatedInterrupt when there are."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank at once when rank 0
        learnt of added or removed hosts since the last check."""
        if _updates_expected():
            self._check_discovered_hosts()
            return
        newest = self._last_updated_timestamp
        removed_only = True
        while not self._host_messages.empty():
            timestamp, removed = self._host_messages.get()
            newest = max(newest, timestamp)
            removed_only = removed_only and removed
        if newest == self._last_updated_timestamp and not _updates_expected():
            return
        previous = self._last_updated_timestamp
        previous, newest, removed_only = self._bcast_object(
            (previous, newest, removed_only))
        self._last_updated_timestamp = newest
        if newest > previous:
            raise HostsUpdatedInterrupt(skip_sync=removed_only)

    def _check_discovered_hosts(self):
        # Rank 0 turns the discovery script's newest listing into a plan;
        # every rank receives it here and raises together. Removed hosts'
        # ranks leave at the reset; the others keep their current state
        # (no rollback, and no sync unless ranks are started).
        members = membership.current()
        plan, removed = [], []
        if members.comm is not None and members.comm.Get_rank() == 0:
            hosts = discovery.poller().hosts()
            if hosts is not None:
                ranks_per_host = members.ranks_per_host()
                removed = discovery.removed_hosts(hosts, ranks_per_host)
                plan = discovery.growth_plan(
                    members.blacklist.usable(hosts), ranks_per_host,
                    members.comm.Get_size(),
                    _settings.from_environment().max_np)
        plan, removed = self._bcast_object((plan, removed))
        if plan or removed:
            members.growth = plan
            members.leaving_hosts = set(removed)
            raise HostsUpdatedInterrupt(skip_sync=not plan)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Called after the ranks changed, before the reset callbacks."""

    def _snapshot(self):
        """What save() saved, as plain data a file can hold; None: this
        kind of state keeps no commit on disk."""
        return None

    def _load_snapshot(self, snapshot):
        """Makes `snapshot` (from _snapshot()) the saved state; restore()
        then applies it."""
        raise NotImplementedError()

    def _keep_commit(self):
        """Counts a commit, and on the first rank of each host hands it to
        the host's file of kept commits, where the job keeps one."""
        self._commits += 1
        kept = kept_commit.for_this_job()
        if kept is None or not basics.is_initialized() or basics.local_rank():
            return
        snapshot = self._snapshot()
        if snapshot is not None:
            kept.keep(self._commits, snapshot)


def _updates_expected():
    # Host changes come from a discovery script; without one, commit()
    # stays local and costs no communication.
    return discovery.enabled() and membership.current().comm is not None


class ObjectState(State):
    """State held as attributes: `ObjectState(epoch=0, batch=0)` gives
    `state.epoch` and `state.batch`, saved and broadcast as Python objects
    (pickled)."""

    def __init__(self, bcast_object=broadcast_object_over_job, get_rank=_rank,
                 **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        # Last in the chain of save()s: a framework state saved its
        # variables before calling it, so the commit kept is whole.
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}
        self._keep_commit()

    def restore(self):
        self._set_attrs()

    def sync(self):
        self._saved_state, self._commits = self._bcast_object(
            (self._saved_state, self._commits))
        self._set_attrs()

    def _snapshot(self):
        return {"attributes": self._saved_state}

    def _load_snapshot(self, snapshot):
        self._saved_state = snapshot["attributes"]

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))
