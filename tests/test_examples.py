# Runs each example in keras_examples/ for a few steps at 2 ranks, as CI
# does, so an API change that breaks them shows up here.

import os
import pathlib
import sys

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "keras_examples"
TIMEOUT_SECONDS = 300


def _env():
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Test this working tree, not an installed copy.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def test_synthetic_benchmark_at_two_ranks():
    script = EXAMPLES / "tensorflow2_synthetic_benchmark.py"
    argv = [sys.executable, str(script),
            "--steps", "3", "--warmup-steps", "2", "--batch-size", "16",
            "--intra-op-threads", "1"]
    result = mpi_launch.launch(argv, 2, TIMEOUT_SECONDS, env=_env(),
                               cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    assert "Total img/sec on 2 ranks:" in result.output, result.describe()
    assert "Rank 1:" in result.output, result.describe()
