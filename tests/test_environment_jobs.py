"""Settings in real jobs: Horovod's HOROVOD_* variables, and TFRING_* values
that once crashed or confused every rank.

Each case runs tests/job_scripts/environment_job.py (one allreduce, then a
restart of tfring) at 1 and 2 ranks with the PyTorch front end, and at 2
with TensorFlow's, and reads every rank's configuration back through
tfring._core.config():
  * HOROVOD_* values take effect in Horovod's units, on every rank, and say
    which variable set them; TFRING_* wins over its Horovod name with one
    report per job; unsupported HOROVOD_* variables are named once per job;
  * HOROVOD_DYNAMIC_PROCESS_SETS=1 lets add_process_set() work after init(),
    as in Horovod's test_torch.py;
  * TFRING_SHM_BYTES=2^63-1 (both ranks died of SIGSEGV: the segment's size
    wrapped) and TFRING_SHM_TIMEOUT_SECONDS=nan (accepted, then "nan on this
    rank but nan on rank 0") keep their defaults with a warning, and the
    allreduce runs through shared memory.
"""
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

import mpi_launch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "job_scripts" / "environment_job.py"
JOB_TIMEOUT_S = 240
FRONT_ENDS = [("torch", 1), ("torch", 2), ("tensorflow", 2)]


def _run(front_end, ranks, **settings):
    if front_end == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    env = mpi_launch.working_tree_env(quiet_tensorflow=True)
    for name in list(env):
        if name.startswith(("TFRING_", "HOROVOD_")):
            del env[name]
    env.update(settings)
    result = mpi_launch.launch([sys.executable, str(SCRIPT), front_end], ranks,
                               JOB_TIMEOUT_S, env=env, cwd=str(ROOT))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    reports = {int(m.group(1)): json.loads(m.group(2))
               for m in re.finditer(r"^REPORT (\d+) (.*)$", result.output, re.MULTILINE)}
    assert sorted(reports) == list(range(ranks)), result.describe()
    for rank in range(ranks):
        assert f"RESTARTED {rank}" in result.output, result.describe()
    return result, reports


def _knob(report, env):
    return report["config"][env]["value"], report["config"][env]["set_by"]


@pytest.mark.parametrize("front_end,ranks", FRONT_ENDS)
def test_horovod_variables_take_effect(front_end, ranks):
    result, reports = _run(
        front_end, ranks,
        HOROVOD_FUSION_THRESHOLD="33554432",
        HOROVOD_CYCLE_TIME="2.5",
        HOROVOD_STALL_CHECK_DISABLE="1",
        HOROVOD_TIMELINE="DYNAMIC",
        HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES="30",
        HOROVOD_LOG_LEVEL="warning",
        # Both names: TFRING_* wins, and the difference is reported once.
        TFRING_CACHE_CAPACITY="5", HOROVOD_CACHE_CAPACITY="7",
        # Not supported: named once per job, build-time ones as such.
        HOROVOD_THREAD_AFFINITY="0,1", HOROVOD_WITH_PYTORCH="1",
        HOROVOD_GPU_OPERATIONS="NCCL")
    for rank, report in reports.items():
        assert _knob(report, "TFRING_FUSION_THRESHOLD") == (
            "33554432", "HOROVOD_FUSION_THRESHOLD"), rank
        assert _knob(report, "TFRING_CYCLE_TIME") == ("2.5", "HOROVOD_CYCLE_TIME"), rank
        assert _knob(report, "TFRING_STALL_CHECK_TIME_SECONDS") == (
            "0", "HOROVOD_STALL_CHECK_DISABLE"), rank
        assert _knob(report, "TFRING_TIMELINE") == ("", "HOROVOD_TIMELINE"), rank
        assert _knob(report, "TFRING_AUTOTUNE_MAX_TRIALS") == (
            "30", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"), rank
        assert _knob(report, "TFRING_LOG_LEVEL") == ("3", "HOROVOD_LOG_LEVEL"), rank
        assert _knob(report, "TFRING_CACHE_CAPACITY") == ("5", "TFRING_CACHE_CAPACITY"), rank
        assert _knob(report, "TFRING_SHM_BYTES") == ("1048576", ""), rank
        assert report["sum"] == 100000.0 * ranks, report
    conflict = ("TFRING_CACHE_CAPACITY=5 and HOROVOD_CACHE_CAPACITY=7 are both set and "
                "differ; tfring uses TFRING_CACHE_CAPACITY")
    assert result.output.count(conflict) == 1, result.describe()
    unsupported = "tfring does not support these Horovod settings"
    assert result.output.count(unsupported) == 1, result.describe()
    line = next(l for l in result.output.splitlines() if unsupported in l)
    assert "[tfring WARNING rank 0 " in line, line
    assert "HOROVOD_THREAD_AFFINITY (tfring does not pin its background thread" in line, line
    assert "ignored: build-time setting: HOROVOD_GPU_OPERATIONS, HOROVOD_WITH_PYTORCH" in line
    for read in ("HOROVOD_FUSION_THRESHOLD (", "HOROVOD_TIMELINE (", "HOROVOD_LOG_LEVEL ("):
        assert read not in line, line


@pytest.mark.parametrize("ranks", [1, 2])
def test_horovod_dynamic_process_sets(ranks):
    # Horovod's test_torch.py sets HOROVOD_DYNAMIC_PROCESS_SETS=1 before
    # init() and adds even and odd sets in its process-set tests.
    _, reports = _run("torch", ranks, HOROVOD_DYNAMIC_PROCESS_SETS="1")
    for rank, report in reports.items():
        if ranks == 1:
            assert "duplicate of the existing process set 0" in report["dynamic"], report
            continue
        members = [r for r in range(ranks) if r % 2 == rank % 2]
        assert report["dynamic"] == {"set": members, "sum": 3.0 * len(members),
                                     "removed": [True, True]}, report


def test_settings_that_crashed_keep_their_defaults():
    result, reports = _run("torch", 2, TFRING_SHM_BYTES="9223372036854775807",
                           TFRING_SHM_TIMEOUT_SECONDS="nan")
    for rank, report in reports.items():
        assert _knob(report, "TFRING_SHM_BYTES") == ("1048576", "TFRING_SHM_BYTES"), rank
        assert _knob(report, "TFRING_SHM_TIMEOUT_SECONDS") == (
            "30", "TFRING_SHM_TIMEOUT_SECONDS"), rank
        assert report["data_path"] == "shared_memory", report
        assert report["sum"] == 200000.0, report
    assert ("TFRING_SHM_BYTES=9223372036854775807 is above the largest value it takes, "
            "1099511627776; using the default") in result.output, result.describe()
    assert ("TFRING_SHM_TIMEOUT_SECONDS=nan is not a finite non-negative number"
            in result.output), result.describe()
    assert "on this rank but" not in result.output, result.describe()
