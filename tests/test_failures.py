"""A failing rank must never hang the job: real processes under mpirun.

Each case starts a 2- or 3-rank job in which the last rank fails while the
others wait in a collective, and asserts the survivors report the documented
error within a bound (or mpirun ends the job), never a hang.
"""
import json
import os
import re
import sys
from pathlib import Path

import pytest

from mpi_launch import launch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "failure_scripts" / "peer_failure.py")
JOB_TIMEOUT_S = 120
SURVIVOR_BOUND_S = 10.0


def _run(mode, ranks, extra_env=None, args=()):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               **(extra_env or {}))
    return launch([sys.executable, SCRIPT, mode, *args], ranks, timeout=JOB_TIMEOUT_S,
                  env=env, cwd=str(ROOT))


@pytest.mark.parametrize("ranks", [2, 3])
def test_uncaught_exception_on_one_rank_aborts_the_others(ranks, tmp_path):
    # With a timeline recording: the failure that stops the job closes it.
    timeline = tmp_path / "timeline.json"
    result = _run("exception", ranks, {"TFRING_TIMELINE": str(timeline)})
    assert not result.timed_out, result.describe()
    with open(timeline) as f:
        trace = json.load(f)
    rows = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert "warmup" in rows, rows
    last = ranks - 1
    for rank in range(last):
        match = re.search(rf"rank {rank} ABORTED after ([0-9.]+) s: (.*)", result.output)
        assert match, result.describe()
        assert float(match.group(1)) < SURVIVOR_BOUND_S, result.describe()
        assert f"rank {last} shut down" in match.group(2), result.describe()
        assert "pending were cancelled" in match.group(2), result.describe()
        assert "why it stopped" in match.group(2), result.describe()
        assert f"rank {rank} LATER_FAILS_FAST" in result.output, result.describe()
    assert "UNEXPECTED_SUCCESS" not in result.output


@pytest.mark.parametrize("ranks", [2, 3])
def test_killed_rank_ends_the_job(ranks):
    result = _run("kill", ranks)
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, result.describe()
    assert "UNEXPECTED_SUCCESS" not in result.output


@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_killed_inside_a_shared_memory_allreduce_ends_the_job(ranks):
    result = _run("kill_in_allreduce", ranks)
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, result.describe()
    assert "rank 0 SHM True" in result.output, result.describe()
    assert "UNEXPECTED_SUCCESS" not in result.output
    # mpirun usually ends the survivors first; a survivor that noticed the
    # dead peer itself must have said which one.
    last = ranks - 1
    for match in re.finditer(r"rank \d+ ABORTED after [0-9.]+ s: (.*)", result.output):
        assert f"rank {last}" in match.group(1), result.describe()
        assert "exited" in match.group(1), result.describe()


def _run_held(ranks, after_failure, linger_s, tmp_path):
    return _run("stop_in_allreduce", ranks,
                {"TFRING_SHM_TIMEOUT_SECONDS": "1",
                 "TFRING_TEST_LINGER_SECONDS": str(linger_s)},
                args=(str(tmp_path / "failed"), after_failure))


@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_held_inside_a_shared_memory_allreduce_fails_it_on_every_rank(ranks, tmp_path):
    # The last rank is suspended inside an allreduce long enough for the
    # others to give up on it, then resumed while they still run: it must
    # fail that allreduce too, not complete it alone (writing its part into
    # memory the others have abandoned).
    result = _run_held(ranks, "resume", 8, tmp_path)
    assert not result.timed_out, result.describe()
    assert "UNEXPECTED_SUCCESS" not in result.output, result.describe()
    last = ranks - 1
    for rank in range(last):
        match = re.search(rf"rank {rank} ABORTED after [0-9.]+ s: (.*)", result.output)
        assert match, result.describe()
        assert f"rank {last} did not reach a shared-memory allreduce within 1 s" \
            in match.group(1), result.describe()
    match = re.search(rf"rank {last} ABORTED after [0-9.]+ s: (.*)", result.output)
    assert match, result.describe()
    assert (f"gave up on a shared-memory allreduce before rank {last} arrived"
            in match.group(1)), result.describe()
    assert f"so rank {last} fails it too" in match.group(1), result.describe()


@pytest.mark.parametrize("ranks", [2, 3])
def test_survivors_exit_ends_the_job_while_the_held_rank_sleeps(ranks, tmp_path):
    # The held rank stays suspended: MPI_Finalize on the others would wait
    # for it forever; they end the job with the error instead.
    result = _run_held(ranks, "keep", 0, tmp_path)
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, result.describe()
    assert "UNEXPECTED_SUCCESS" not in result.output, result.describe()
    assert re.search(r"rank 0 ABORTED after [0-9.]+ s: .*did not reach a shared-memory "
                     r"allreduce", result.output), result.describe()
    assert "ending the job instead of finalizing MPI" in result.output, result.describe()


def test_stall_warning_names_missing_rank_then_completes():
    result = _run("stall", 3, {"TFRING_STALL_CHECK_TIME_SECONDS": "1"})
    assert result.returncode == 0 and not result.timed_out, result.describe()
    # Rank under rank, what each waits on: the late rank nothing yet.
    assert re.search(r"rank 0 waits on: 'late_tensor'\n  rank 1 waits on: 'late_tensor'\n"
                     r"  rank 2 waits on: nothing", result.output), result.describe()
    for rank in range(3):
        assert f"rank {rank} STALL_DONE 6.0" in result.output, result.describe()


@pytest.mark.parametrize("ranks", [2, 3])
def test_stall_past_the_limit_fails_every_rank_naming_what_each_waits_on(ranks):
    result = _run("stall_limit", ranks, {"TFRING_STALL_CHECK_TIME_SECONDS": "1",
                                         "TFRING_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    assert result.returncode == 0 and not result.timed_out, result.describe()
    assert "UNEXPECTED_SUCCESS" not in result.output, result.describe()
    side_by_side = " | ".join(f"  rank {r} waits on: 'only_on_rank_{r}'" for r in range(ranks))
    for rank in range(ranks):
        match = re.search(rf"rank {rank} STALL_ERROR (.*)", result.output)
        assert match, result.describe()
        message = match.group(1)
        assert "the job stalled: collective 'only_on_rank_" in message, message
        assert "TFRING_STALL_SHUTDOWN_TIME_SECONDS=2" in message, message
        assert side_by_side in message, message
        # The advice fits TensorFlow, Keras and PyTorch alike.
        for cause in ("different numbers of batches", "DistributedSampler",
                      "hvd.join(), in TensorFlow or PyTorch", "same number of steps",
                      "model.fit", "rank-dependent condition", "different models"):
            assert cause in message, (cause, message)
        assert "init()" not in message, message
