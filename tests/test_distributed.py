# Runs the size-agnostic tests in tests/distributed at 1, 2 and 3 ranks.
#
# Why a driver: those files need an MPI job around them; this file runs in
# plain pytest and starts one job per (world size, file), with a timeout, so
# `pytest tests` covers everything and a hang becomes a failure that shows
# the tail of every rank's output.

import os
import pathlib
import sys
import textwrap

import pytest

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
DISTRIBUTED = REPO / "tests" / "distributed"
FILES = sorted(p.name for p in DISTRIBUTED.glob("test_*.py"))
WORLD_SIZES = (1, 2, 3)
TIMEOUT_SECONDS = 900
# pytest dumps every thread's stack if one test runs this long (a hang).
STACK_DUMP_SECONDS = 300


def _env(**extra):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def _run_pytest(path, num_ranks, env):
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p",
            "no:cacheprovider", "-o",
            f"faulthandler_timeout={STACK_DUMP_SECONDS}", str(path)]
    return mpi_launch.launch(argv, num_ranks, TIMEOUT_SECONDS, env=env,
                             cwd=str(REPO))


@pytest.mark.parametrize("num_ranks", WORLD_SIZES)
@pytest.mark.parametrize("test_file", FILES)
def test_distributed(test_file, num_ranks):
    result = _run_pytest(DISTRIBUTED / test_file, num_ranks, _env())
    assert result.returncode == 0 and not result.timed_out, result.describe()


def test_collectives_with_small_fusion_threshold():
    # Sizes just under, at and over a 4 KiB threshold, alone and in batches.
    result = _run_pytest(DISTRIBUTED / "test_collectives.py", 3,
                         _env(TFRING_FUSION_THRESHOLD="4096"))
    assert result.returncode == 0 and not result.timed_out, result.describe()


def test_process_sets_at_four_ranks():
    # Two disjoint sets of two ranks, {0, 1} and {2, 3}, running different
    # collectives interleaved with global ones (the tests that need 4 ranks
    # skip at 1, 2 and 3).
    result = _run_pytest(DISTRIBUTED / "test_process_sets.py", 4, _env())
    assert result.returncode == 0 and not result.timed_out, result.describe()


_NO_SHUTDOWN_SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    import tfring
    tfring.init()
    total = tfring.allreduce(tf.constant([1.0]), op=tfring.Sum)
    assert float(total[0]) == tfring.size()
    print(f"rank {tfring.rank()} done", flush=True)
    # No tfring.shutdown(): the atexit hook must stop the background thread
    # before mpi4py finalizes MPI.
""")


@pytest.mark.parametrize("num_ranks", (1, 2, 3))
def test_script_exits_cleanly_without_shutdown(num_ranks):
    result = mpi_launch.launch([sys.executable, "-c", _NO_SHUTDOWN_SCRIPT],
                               num_ranks, 300, env=_env(), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    for rank in range(num_ranks):
        assert f"rank {rank} done" in result.output, result.describe()
    assert "terminate called" not in result.output, result.describe()


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


@pytest.mark.parametrize("num_ranks", (1, 2))
def test_init_refuses_mpi_without_thread_multiple(num_ranks):
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
