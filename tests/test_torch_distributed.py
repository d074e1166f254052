# Runs the size-agnostic tfring.torch tests in tests/torch_distributed at 1,
# 2 and 3 ranks, all files in one job per world size (each rank pays Python,
# torch and tfring start-up once). Skipped where torch is not installed:
# tfring does not require it (tools/install.sh installs it for these tests).

import importlib.util
import pathlib
import sys

import pytest

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
FOLDER = REPO / "tests" / "torch_distributed"
FILES = sorted(str(p) for p in FOLDER.glob("test_*.py"))
TIMEOUT_SECONDS = 900
STACK_DUMP_SECONDS = 300

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed")


@pytest.mark.parametrize("num_ranks", (1, 2, 3))
def test_torch_distributed(num_ranks):
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p",
            "no:cacheprovider", "-o",
            f"faulthandler_timeout={STACK_DUMP_SECONDS}", *FILES]
    env = mpi_launch.working_tree_env(quiet_tensorflow=True)
    result = mpi_launch.launch(argv, num_ranks, TIMEOUT_SECONDS, env=env,
                               cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
