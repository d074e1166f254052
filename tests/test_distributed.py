# Runs the size-agnostic tests in tests/distributed at 1, 2 and 3 ranks.
#
# Why a driver: those files need an MPI job around them; this file runs in
# plain pytest and starts MPI jobs with a timeout, so `pytest tests` covers
# everything and a hang becomes a failure that shows the tail of every
# rank's output.
#
# Why groups of files: every job pays Python, TensorFlow and tfring
# start-up on every rank (several seconds on two shared cores), which was
# most of the suite's time with one job per file. So each job runs a group
# of files in one pytest session; the group's files are in the test id, and
# a failure report starts with the failing rank's file and test. The files
# restore what they change (tfring's init and process sets, the Keras dtype
# policy), which is what lets them share a process; OWN_PROCESS lists the
# files that cannot, and why.

import math
import os
import pathlib
import re
import sys
import textwrap

import pytest

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
DISTRIBUTED = REPO / "tests" / "distributed"
FILES = sorted(p.name for p in DISTRIBUTED.glob("test_*.py"))
WORLD_SIZES = (1, 2, 3)
# At most this many files per job: small enough that one job stays well
# inside its timeout (a failure report names the failing file and test
# anyway), large enough that start-up is paid only a few times per world
# size (3 jobs per world size today).
MAX_FILES_PER_GROUP = 11
# A job's timeout: a base for start-up plus a share per file (several
# times what a file takes at 3 ranks on two busy cores), so a hang ends.
TIMEOUT_BASE_SECONDS = 300
TIMEOUT_PER_FILE_SECONDS = 150
# pytest dumps every thread's stack if one test runs this long (a hang);
# shorter than any job's timeout, so the dump names the hanging test.
STACK_DUMP_SECONDS = 300


def _groups(files, max_size):
    """`files` (sorted) cut into the fewest runs of consecutive files of at
    most `max_size`, of near-equal length; new files join automatically."""
    count = max(1, math.ceil(len(files) / max_size))
    size, extra = divmod(len(files), count)
    groups, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        groups.append(tuple(files[start:end]))
        start = end
    return [g for g in groups if g]


def _group_id(group):
    return "+".join(name[len("test_"):-len(".py")] for name in group)


# Files that cannot share a process with other files, and why; each runs
# in a job of its own. (None today: every file restores what it changes.)
OWN_PROCESS = set()
GROUPS = (_groups([f for f in FILES if f not in OWN_PROCESS],
                  MAX_FILES_PER_GROUP)
          + [(f,) for f in FILES if f in OWN_PROCESS])


def _env(**extra):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def _run_pytest(files, num_ranks, env):
    """One job: pytest on `files` (names in tests/distributed) at
    `num_ranks` ranks; stops at the first failure (conftest aborts every
    rank then)."""
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p",
            "no:cacheprovider", "-o",
            f"faulthandler_timeout={STACK_DUMP_SECONDS}"]
    argv += [str(DISTRIBUTED / name) for name in files]
    timeout = TIMEOUT_BASE_SECONDS + TIMEOUT_PER_FILE_SECONDS * len(files)
    return mpi_launch.launch(argv, num_ranks, timeout, env=env,
                             cwd=str(REPO))


# Lines that name a failing test: conftest's banner on the rank that
# aborted the job, pytest's short summary at one rank, and a test file's
# frames in the stack dump of a hang.
_FAILURE_LINE = re.compile(
    r"^\s*(===== tfring test .* on rank .*|(FAILED|ERROR) \S+\.py::.*"
    r'|File ".*/distributed/test_\w+\.py", line \d+ in \w+)\s*$',
    re.MULTILINE)


def _report(result):
    """describe(), led by the lines that name the failing file and test (a
    long traceback or other ranks' output can push them out of the tail)."""
    lines = dict.fromkeys(m[0] for m in _FAILURE_LINE.findall(result.output))
    head = ("failing tests:\n" + "\n".join(lines) + "\n") if lines else ""
    return head + result.describe()


def _assert_passed(result):
    assert result.returncode == 0 and not result.timed_out, _report(result)
    # Every job exits with tfring running (conftest does not shut it down):
    # the atexit hook must stop the background thread before mpi4py
    # finalizes MPI, or a rank dies in std::terminate.
    assert "terminate called" not in result.output, _report(result)


@pytest.mark.parametrize("num_ranks", WORLD_SIZES)
@pytest.mark.parametrize("files", [pytest.param(g, id=_group_id(g))
                                   for g in GROUPS])
def test_distributed(files, num_ranks):
    _assert_passed(_run_pytest(files, num_ranks, _env()))


def test_collectives_with_small_fusion_threshold():
    # Sizes just under, at and over a 4 KiB threshold, alone and in batches.
    _assert_passed(_run_pytest(["test_collectives.py"], 3,
                               _env(TFRING_FUSION_THRESHOLD="4096")))


def test_process_sets_at_four_ranks():
    # Two disjoint sets of two ranks, {0, 1} and {2, 3}, running different
    # collectives interleaved with global ones (the tests that need 4 ranks
    # skip at 1, 2 and 3).
    _assert_passed(_run_pytest(["test_process_sets.py"], 4, _env()))


_STATIC_SETS_SCRIPT = textwrap.dedent("""
    import os
    import sys
    import mpi4py
    mpi4py.rc.initialize = False  # as Horovod's process-set test does
    from mpi4py import MPI
    import tensorflow as tf
    import tfring as hvd

    assert not MPI.Is_initialized()
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    # Horovod's test_process_sets_static sequence: a list with duplicates
    # (the global set, and [0] twice; a permutation is the same set), then
    # a valid one.
    upper = range(1, size) if rank == 0 else reversed(range(1, size))
    bad_lists = [
        [hvd.ProcessSet([0]), hvd.ProcessSet(upper),
         hvd.ProcessSet(range(size - 1, -1, -1)), hvd.ProcessSet([0])],
        [hvd.ProcessSet([0]), hvd.ProcessSet(range(1, size)),
         hvd.ProcessSet([0])],
    ]
    for bad in bad_lists:
        try:
            hvd.init(process_sets=bad)
        except ValueError as e:
            print(f"rank {rank} ValueError: {e}", flush=True)
        assert not hvd.is_initialized()
    good = [hvd.ProcessSet([0]), hvd.ProcessSet(reversed(range(1, size)))]
    hvd.init(process_sets=good)
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE
    table = hvd.mpi_ops._basics._get_process_set_ids_and_ranks()
    assert table == {0: list(range(size)), 1: [0],
                     2: list(range(1, size))}, table
    mine = good[0] if rank == 0 else good[1]
    total = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum,
                          process_set=mine)
    assert float(total[0]) == sum(mine.ranks)
    MPI.COMM_WORLD.barrier()
    hvd.shutdown()
    # MPI keeps running after shutdown(), so tfring starts again; tfring
    # finalizes it at exit.
    hvd.init()
    total = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)
    assert float(total[0]) == size
    if sys.argv[1:] == ["finalize"]:
        # Or the script finalizes MPI itself, after which init() says why it
        # cannot start.
        hvd.shutdown()
        MPI.Finalize()
        try:
            hvd.init()
        except ValueError as e:
            print(f"rank {rank} after finalize ValueError: {e}", flush=True)
    print(f"rank {rank} done", flush=True)
""")


# At 2 ranks the script ends by finalizing MPI itself; at 3 it leaves that
# to tfring at exit.
@pytest.mark.parametrize("num_ranks,ending", [(2, "finalize"), (3, "exit")])
def test_init_starts_mpi_and_refuses_duplicate_sets_on_every_rank(
        num_ranks, ending):
    result = mpi_launch.launch([sys.executable, "-c", _STATIC_SETS_SCRIPT, ending],
                               num_ranks, 300, env=_env(), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    everyone = list(range(num_ranks))
    for rank in everyone:
        assert (f"rank {rank} ValueError: tfring.init() received in "
                f"process_sets entry 2 ProcessSet(process_set_id=None, "
                f"ranks={everyone}) with every rank of the job ({everyone}), "
                "the same ranks as the global set. Expected a set that "
                "differs from every other. Use tfring.global_process_set "
                "instead.") in result.output, result.describe()
        assert (f"rank {rank} ValueError: tfring.init() received "
                "process_sets entry 2 ProcessSet(process_set_id=None, "
                "ranks=[0]) with ranks [0], which an earlier entry already "
                "has. Expected each set once (duplicates are not allowed). "
                "Remove the duplicate, or reuse the first object."
                ) in result.output, result.describe()
        if ending == "finalize":
            assert (f"rank {rank} after finalize ValueError: tfring.init() found "
                    "MPI already finalized (MPI.Finalize() was called in this "
                    "process). Expected MPI running or not started yet: it "
                    "cannot be started again in the same process."
                    ) in result.output, result.describe()
        assert f"rank {rank} done" in result.output, result.describe()
    # Open MPI's complaint about a process that exits with MPI running.
    assert 'calling "finalize"' not in result.output, result.describe()


_COMMUNICATOR_SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    from mpi4py import MPI
    import tfring

    world = MPI.COMM_WORLD
    r = world.Get_rank()
    # A list of ranks: ranks 0 and 1 form the job; rank 2 is refused.
    if r == 2:
        try:
            tfring.init([0, 1])
        except ValueError as e:
            assert "not in that list" in str(e), str(e)
            print("rank 2 refused", flush=True)
    else:
        tfring.init([0, 1])
        assert (tfring.size(), tfring.rank()) == (2, r)
        total = tfring.allreduce(tf.constant([1.0]), op=tfring.Sum)
        assert float(total[0]) == 2.0
        tfring.shutdown()
        print(f"rank {r} subset ok", flush=True)
    world.Barrier()
    # An mpi4py communicator: even and odd world ranks, two separate jobs.
    sub = world.Split(r % 2, r)
    tfring.init(sub)
    assert (tfring.size(), tfring.rank()) == (sub.Get_size(), sub.Get_rank())
    total = tfring.allreduce(tf.constant([float(r)]), op=tfring.Sum)
    expected = sum(x for x in range(world.Get_size()) if x % 2 == r % 2)
    assert float(total[0]) == expected, (float(total[0]), expected)
    tfring.shutdown()
    print(f"rank {r} split ok", flush=True)
""")


def test_init_with_ranks_list_and_communicator():
    result = mpi_launch.launch([sys.executable, "-c", _COMMUNICATOR_SCRIPT],
                               3, 300, env=_env(), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    for line in ["rank 2 refused", "rank 0 subset ok", "rank 1 subset ok",
                 "rank 0 split ok", "rank 1 split ok", "rank 2 split ok"]:
        assert line in result.output, result.describe()


_THREAD_LEVEL_SCRIPT = textwrap.dedent("""
    import mpi4py
    mpi4py.rc.thread_level = "serialized"  # lower than tfring needs
    from mpi4py import MPI
    import tfring
    try:
        tfring.init()
    except RuntimeError as e:
        print(f"rank {MPI.COMM_WORLD.Get_rank()} REFUSED: {e}", flush=True)
    else:
        print("UNEXPECTED_SUCCESS", flush=True)
""")


def test_init_refuses_mpi_without_thread_multiple():
    num_ranks = 2  # each rank refuses on its own: 2 ranks cover 1
    # tfring's background thread calls MPI while other threads may: with a
    # lower thread level that is undefined behaviour, so init() says how to
    # get MPI_THREAD_MULTIPLE instead of starting.
    result = mpi_launch.launch([sys.executable, "-c", _THREAD_LEVEL_SCRIPT],
                               num_ranks, 300, env=_env(), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    assert "UNEXPECTED_SUCCESS" not in result.output, result.describe()
    for rank in range(num_ranks):
        assert (f"rank {rank} REFUSED: tfring needs MPI initialized with "
                "MPI_THREAD_MULTIPLE, but MPI provides MPI_THREAD_SERIALIZED"
                in result.output), result.describe()
        assert 'mpi4py.rc.thread_level = ...' in result.output
