"""Elastic training through each front end, with real processes: Keras
model.fit with tfring.keras.elastic's callbacks, and a PyTorch loop with
TorchState and ElasticSampler; 3 ranks under tfringrun, one killed with
SIGKILL mid-training, the survivors finish with the same weights. Each run
has a timeout that ends the whole job."""
import json
import os
import sys

import pytest

from mpi_launch import launch_command, working_tree_env
from tfring.elastic import runner, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "elastic_scripts")
JOB_TIMEOUT_S = 480  # a bound for a hang; loaded CI machines need minutes


def _run_elastic(script, kill_rank):
    command = [sys.executable, "-m", "tfring.launcher.cli", "-np", "3",
               "--min-np", "2", sys.executable, os.path.join(SCRIPTS, script),
               str(kill_rank)]
    env = working_tree_env(
        quiet_tensorflow=True, TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1",
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = launch_command(command, JOB_TIMEOUT_S, env=env, cwd=ROOT)
    assert not result.timed_out, result.describe()
    assert result.returncode == 0, result.describe()
    results = [json.loads(line.split("RESULT ", 1)[1])
               for line in result.output.splitlines() if "RESULT " in line]
    assert sorted(r["original_rank"] for r in results) == [
        r for r in range(3) if r != kill_rank], result.describe()
    assert "saw a failure, resetting: tfring stopped" in result.output
    return results


@pytest.mark.parametrize("script,kill_rank", [
    ("keras_fit.py", 1),
    ("torch_loop.py", 2),
])
def test_killed_rank_survivors_finish_every_epoch_with_the_same_weights(
        script, kill_rank):
    results = _run_elastic(script, kill_rank)
    for r in results:
        assert r["size"] == 2 and r["epoch"] == 3, results
    assert results[0]["weights"] == results[1]["weights"], results


def test_without_the_elastic_options_run_calls_the_function_once():
    # Plain tfringrun: no fault tolerance to recover with; the state is
    # synced and the function runs (Horovod's behaviour there).
    command = [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
               sys.executable, os.path.join(SCRIPTS, "torch_loop.py"), "-1"]
    env = working_tree_env(OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = launch_command(command, JOB_TIMEOUT_S, env=env, cwd=ROOT)
    assert not result.timed_out, result.describe()
    assert result.returncode == 0, result.describe()
    results = [json.loads(line.split("RESULT ", 1)[1])
               for line in result.output.splitlines() if "RESULT " in line]
    assert [r["epoch"] for r in results] == [3, 3], result.describe()
    assert results[0]["weights"] == results[1]["weights"], result.describe()


class _Members:
    def __init__(self, size, resets):
        self.resets = resets
        self.comm = type("Comm", (), {"Get_size": lambda self: size})()


def test_more_resets_than_the_limit_end_the_job():
    limits = settings.Settings(enabled=True, min_np=1, reset_limit=2)
    runner._check_limits(_Members(3, 2), limits)
    with pytest.raises(RuntimeError, match=r"reset 3 times, more than the "
                       r"reset limit 2 \(--reset-limit\)"):
        runner._check_limits(_Members(3, 3), limits)


def test_settings_come_from_the_environment():
    read = settings.from_environment({
        "TFRING_ELASTIC": "1", "TFRING_ELASTIC_MIN_NP": "2",
        "TFRING_ELASTIC_RESET_LIMIT": "4"})
    assert (read.enabled, read.min_np, read.reset_limit) == (True, 2, 4)
    with pytest.raises(ValueError, match=r"TFRING_ELASTIC_MIN_NP='two' is "
                       r"not an integer"):
        settings.from_environment({"TFRING_ELASTIC_MIN_NP": "two"})
