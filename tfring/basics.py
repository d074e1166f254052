# Process lifecycle and topology: init(), shutdown() and the rank/size queries.
#
# Why this file exists: it is where the job starts and stops. init()
# imports mpi4py (which initialises MPI, or leaves it to tfring after
# `mpi4py.rc.initialize = False`), turns the caller's communicator
# into a Fortran handle, has process_sets.py work out the process sets (the
# only other Python code that talks to MPI, once, at init) and starts the
# core's background thread through tfring._core; an atexit hook stops that
# thread before mpi4py finalises MPI, so a script that never calls
# shutdown() still exits cleanly. Topology functions raise ValueError before
# init(), as Horovod's do.

import atexit
import numbers
import os
import sys

from tfring import _core
from tfring import _elastic_communicator
from tfring import _mpi_yield
from tfring import _running
from tfring import process_sets as _process_sets

_state = {
    "atexit_registered": False,
    # Set by init(): every host runs the same number of ranks.
    "homogeneous": True,
}


def _initialize_mpi(MPI):
    """Initialises MPI with MPI_THREAD_MULTIPLE unless it runs already.

    mpi4py initialises MPI when imported, unless the script set
    `mpi4py.rc.initialize = False` first; then tfring does, as Horovod
    does, and finalises it at exit (not at shutdown(): MPI cannot start
    twice in a process, and init() may follow shutdown()). The core checks
    the thread level it got.
    """
    if MPI.Is_finalized():
        raise ValueError(
            "tfring.init() found MPI already finalized (MPI.Finalize() was "
            "called in this process). Expected MPI running or not started "
            "yet: it cannot be started again in the same process. Call "
            "MPI.Finalize() only after tfring.shutdown(), at the end of the "
            "script, or leave it to mpi4py and tfring.")
    if MPI.Is_initialized():
        return
    with _mpi_yield.while_mpi_starts():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    # Registered before _shutdown_at_exit (at the end of the first
    # successful init()), so it runs after it: atexit runs last-in first.
    atexit.register(_finalize_mpi_at_exit, MPI)


def _finalize_mpi_at_exit(MPI):
    if not MPI.Is_finalized():
        MPI.Finalize()


def _check_ranks(ranks, world_size):
    ranks = list(ranks)
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral):
            raise TypeError(
                f"tfring.init(comm={ranks!r}) received a rank of type "
                f"{type(r).__name__}. Expected integers in [0, {world_size}). "
                "Pass a list of ints, or an mpi4py communicator.")
        if not 0 <= r < world_size:
            raise ValueError(
                f"tfring.init(comm={ranks!r}) received rank {r}, outside "
                f"MPI_COMM_WORLD (size {world_size}). Expected ranks in "
                f"[0, {world_size}). Launch more processes (mpirun -np N) or "
                "remove that rank from the list.")
    if len(set(int(r) for r in ranks)) != len(ranks):
        raise ValueError(
            f"tfring.init(comm={ranks!r}) received a rank more than once. "
            "Expected distinct ranks. Remove the duplicates.")
    return [int(r) for r in ranks]


def _communicator_from_ranks(MPI, ranks):
    """A new communicator over `ranks` of COMM_WORLD (the caller frees it)."""
    world = MPI.COMM_WORLD
    ranks = _check_ranks(ranks, world.Get_size())
    if world.Get_rank() not in ranks:
        raise ValueError(
            f"tfring.init(comm={ranks!r}) was called on MPI_COMM_WORLD rank "
            f"{world.Get_rank()}, which is not in that list. Expected every "
            "process that calls tfring.init(comm=ranks) to be one of the "
            "ranks. Call tfring.init() only on the listed ranks, or add this "
            "rank to the list.")
    world_group = world.Get_group()
    group = world_group.Incl(ranks)
    try:
        # Collective over the members of `group` only: the ranks left out
        # never reach this line.
        return world.Create_group(group)
    finally:
        group.Free()
        world_group.Free()


def init(comm=None, process_sets=None):
    """Initializes tfring and starts its background thread.

    Args:
      comm: None for MPI_COMM_WORLD; an mpi4py communicator (tfring
        duplicates it, so its traffic never matches yours); or a list of
        MPI_COMM_WORLD ranks to build a communicator from (every listed rank
        must call init() with the same list).
      process_sets: None (only tfring.global_process_set); a list of
        tfring.ProcessSet, registered with ids 1, 2, ... in order (the
        objects get their process_set_id and ranks; the same list on every
        rank); or "dynamic" to add and remove sets later with
        tfring.add_process_set() / tfring.remove_process_set().
        HOROVOD_DYNAMIC_PROCESS_SETS=1 in the environment (Horovod's
        variable) makes sets dynamic too, whatever this argument is.

    Calling init() again while initialized does nothing. MPI is started
    with MPI_THREAD_MULTIPLE if it is not running yet (after
    `mpi4py.rc.initialize = False`), and then finalized at exit.

    Raises:
      ValueError / TypeError: bad arguments, among them process_sets with a
        duplicate set or lists that differ between ranks; raised on every
        rank before anything starts, so init() may be called again.
    """
    # Importing mpi4py.MPI initialises MPI, unless mpi4py.rc.initialize is
    # False.
    from mpi4py import MPI

    _initialize_mpi(MPI)

    owned = None
    if comm is None:
        # An elastic job's communicator: a rank started into the running
        # job has merged with the others (tfring/elastic/membership.py).
        comm = _elastic_communicator.communicator
    if comm is None:
        comm = MPI.COMM_WORLD
    elif isinstance(comm, (list, tuple, range)) and len(comm) == 0:
        comm = MPI.COMM_WORLD  # Horovod's meaning of an empty list: every rank
    elif isinstance(comm, (list, tuple, range)):
        comm = owned = _communicator_from_ranks(MPI, comm)
    elif not isinstance(comm, MPI.Comm):
        raise TypeError(
            f"tfring.init(comm=...) received a {type(comm).__name__}. "
            "Expected None, an mpi4py communicator (e.g. MPI.COMM_WORLD."
            "Split(...)) or a list of MPI_COMM_WORLD ranks. Pass one of "
            "those.")
    if comm == MPI.COMM_NULL:
        raise ValueError(
            "tfring.init(comm=MPI.COMM_NULL) received a null communicator. "
            "Expected a communicator that contains this process. Pass the "
            "communicator returned on this rank by Split/Create, or None.")
    if comm.Is_inter():
        raise ValueError(
            "tfring.init(comm=...) received an intercommunicator. Expected an "
            "intracommunicator. Merge it first (comm.Merge()).")
    try:
        if _core.is_initialized():
            # A no-op, also for process_sets: their exchange between the
            # ranks must not run when only some ranks call init() again.
            return
        ranks_lists, dynamic, finish = _process_sets.prepare_init(
            process_sets, comm)
        _core.init(comm.py2f(), ranks_lists, dynamic)
        # Whether every host runs as many ranks (Horovod's is_homogeneous).
        local_sizes = comm.allgather(_core.local_size())
        _state["homogeneous"] = len(set(local_sizes)) == 1
    finally:
        if owned is not None:
            owned.Free()  # The core holds its own duplicate.
    finish()
    _running.set_shut_down(False)
    if not _state["atexit_registered"]:
        # Registered after mpi4py's own exit hook (imported above), so it runs
        # first: the background thread stops before MPI is finalised.
        atexit.register(_shutdown_at_exit)
        _state["atexit_registered"] = True


def shutdown():
    """Stops the background thread on every rank; pending collectives fail.

    Safe to call more than once, and before init().
    """
    if not _core.is_initialized():
        return
    try:
        _core.shutdown()
    finally:
        _process_sets.on_shutdown()
    _running.set_shut_down(True)


def _shutdown_at_exit():
    try:
        shutdown()
    except Exception as e:  # Exiting anyway: report, don't raise.
        print(f"tfring: shutdown at exit failed: {e}", file=sys.stderr)


def is_initialized():
    """Whether init() has been called (and shutdown() has not)."""
    return bool(_core.is_initialized())


_check_initialized = _running.check_initialized


def start_timeline(file_path, mark_cycles=False):
    """Starts recording a timeline of every collective into `file_path`.

    Rank 0 writes the file (a Chrome trace-event JSON file: open it in
    https://ui.perfetto.dev or chrome://tracing, or summarise it with
    `python -m tfring.timeline FILE`); on the other ranks this call does
    nothing, so it may be called on every rank or on rank 0 alone. A
    recording in progress is closed first. With `mark_cycles=True` each
    background-loop cycle that ran collectives is marked too.
    """
    _check_initialized("start_timeline")
    _core.start_timeline(os.fspath(file_path), bool(mark_cycles))


def stop_timeline():
    """Stops the timeline and closes its file (valid JSON from then on).

    Does nothing when no timeline records. The file is also closed by
    `shutdown()`, at interpreter exit, and when a failure stops the job.
    """
    _check_initialized("stop_timeline")
    _core.stop_timeline()


def size():
    """The number of processes taking part."""
    return _running.size("tfring.size()")


def rank():
    """This process's rank, in [0, size())."""
    return _running.rank("tfring.rank()")


def local_size():
    """The number of processes on this host."""
    _check_initialized("tfring.local_size()")
    return _core.local_size()


def local_rank():
    """This process's rank among the processes on this host."""
    _check_initialized("tfring.local_rank()")
    return _core.local_rank()


def cross_size():
    """The number of hosts that have a process with this local_rank()."""
    _check_initialized("tfring.cross_size()")
    return _core.cross_size()


def cross_rank():
    """This host's index among the hosts in cross_size()."""
    _check_initialized("tfring.cross_rank()")
    return _core.cross_rank()


def mpi_threads_supported():
    """Whether MPI provides MPI_THREAD_MULTIPLE (so mpi4py calls are safe
    alongside tfring's background thread)."""
    _check_initialized("tfring.mpi_threads_supported()")
    return bool(_core.mpi_threads_supported())


def mpi_built():
    """tfring always communicates over MPI."""
    return True


def mpi_enabled():
    """Whether MPI is in use now (True once initialized)."""
    return is_initialized()


def shm_enabled():
    """Whether the ranks move data and negotiate through one shared-memory
    segment (all ranks on one host, TFRING_SHM not 0, and /dev/shm had room;
    otherwise MPI carries everything)."""
    _check_initialized("tfring.shm_enabled()")
    return bool(_core.shm_enabled())


def data_path():
    """How allreduces of the global set move data: 'shared_memory' (every
    rank on one host), 'hierarchical' (several hosts with the same number of
    ranks, two or more, on each: wire-compressed allreduces, and others as
    TFRING_HIERARCHICAL_ALLREDUCE says, are reduced inside each host, then
    across hosts) or 'mpi'."""
    _check_initialized("tfring.data_path()")
    return _core.data_path()


def nccl_built():
    """The NCCL version tfring was built with, as an int; 0 without NCCL
    (always, for now). An int, as in Horovod."""
    from tfring import _build_info
    return int(getattr(_build_info, "NCCL_BUILT", 0))


def is_homogeneous():
    """Whether every host runs the same number of ranks (found at init)."""
    _check_initialized("tfring.is_homogeneous()")
    return _state["homogeneous"]


def gloo_built():
    """Whether tfring was built with Gloo: always False (Horovod compatibility; tfring runs
    over MPI and shared memory)."""
    return False


def gloo_enabled():
    """Whether Gloo is in use: always False (Horovod compatibility; tfring runs
    over MPI and shared memory)."""
    return False


def ddl_built():
    """Whether tfring was built with IBM DDL: always False (Horovod compatibility; tfring runs
    over MPI and shared memory)."""
    return False


def ccl_built():
    """Whether tfring was built with oneCCL: always False (Horovod compatibility; tfring runs
    over MPI and shared memory)."""
    return False


def cuda_built():
    """Whether tfring was built with CUDA support: always False (Horovod compatibility; tfring runs
    over MPI and shared memory)."""
    return False


def rocm_built():
    """Whether tfring was built with ROCm support: always False (Horovod compatibility; tfring runs
    over MPI and shared memory)."""
    return False
