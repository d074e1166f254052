# Runs the size-agnostic tfring.mxnet tests in tests/mxnet_distributed at 1,
# 2 and 3 ranks with the MXNet environment's Python (tests/mxnet_env.py),
# all files in one job per world size. Skipped where that environment is
# missing.

import pytest

import mpi_launch
import mxnet_env

FOLDER = mxnet_env.REPO / "tests" / "mxnet_distributed"
FILES = sorted(str(p) for p in FOLDER.glob("test_*.py"))
TIMEOUT_SECONDS = 480  # about 15-50 s each on a quiet machine
STACK_DUMP_SECONDS = 300

pytestmark = pytest.mark.skipif(not mxnet_env.available(), reason=mxnet_env.MISSING_REASON)


@pytest.fixture(scope="module")
def overlay(tmp_path_factory):
    return mxnet_env.make_overlay(tmp_path_factory.mktemp("mxnet_overlay"))


@pytest.mark.parametrize("num_ranks", (1, 2, 3))
def test_mxnet_distributed(num_ranks, overlay, monkeypatch):
    env = mxnet_env.rank_env(overlay, monkeypatch)
    argv = [str(mxnet_env.PYTHON), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
            "-c", str(mxnet_env.REPO / "pytest.ini"), "--rootdir", str(mxnet_env.REPO),
            "-o", f"faulthandler_timeout={STACK_DUMP_SECONDS}", *FILES]
    result = mpi_launch.launch(argv, num_ranks, TIMEOUT_SECONDS, env=env, cwd=str(overlay))
    assert result.returncode == 0 and not result.timed_out, result.describe()
