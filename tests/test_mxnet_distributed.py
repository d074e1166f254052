# Runs the size-agnostic tfring.mxnet tests in tests/mxnet_distributed at 1,
# 2 and 3 ranks with the MXNet environment's Python (.venv-mxnet, which
# tools/install.sh makes: MXNet 1.9.1 needs NumPy < 1.24, which TensorFlow
# 2.21 cannot share), all files in one job per world size. Skipped where
# that environment is missing.
#
# The ranks run this working tree's Python sources over the native libraries
# installed in .venv-mxnet (built there without TensorFlow): an overlay
# folder holds a copy of tfring/*.py and links to those libraries, so a
# change to the Python layer is tested without reinstalling; a change to
# the C++ core needs tools/install.sh again.

import os
import pathlib
import shutil
import subprocess

import pytest

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
FOLDER = REPO / "tests" / "mxnet_distributed"
FILES = sorted(str(p) for p in FOLDER.glob("test_*.py"))
VENV = pathlib.Path(os.environ.get("TFRING_MXNET_VENV", REPO / ".venv-mxnet"))
PYTHON = VENV / "bin" / "python"
TIMEOUT_SECONDS = 240
STACK_DUMP_SECONDS = 150

pytestmark = pytest.mark.skipif(
    not PYTHON.is_file(),
    reason=f"no MXNet environment at {VENV} (tools/install.sh makes it; "
           "TFRING_SKIP_MXNET=1 skips that step)")


def installed_package():
    """The tfring folder installed in the MXNet environment."""
    found = subprocess.run(
        [str(PYTHON), "-c", "import tfring, os; print(os.path.dirname(tfring.__file__))"],
        cwd="/", capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, (
        "tfring is not installed in the MXNet environment: run tools/install.sh\n"
        + found.stderr[-2000:])
    return pathlib.Path(found.stdout.strip())


@pytest.fixture(scope="module")
def overlay(tmp_path_factory):
    """A folder whose tfring is this tree's Python with the MXNet
    environment's native libraries."""
    installed = installed_package()
    root = tmp_path_factory.mktemp("mxnet_overlay")
    shutil.copytree(REPO / "tfring", root / "tfring",
                    ignore=shutil.ignore_patterns("*.so", "_build_info.py", "__pycache__"))
    for native in [*installed.rglob("*.so"), installed / "_build_info.py"]:
        target = root / "tfring" / native.relative_to(installed)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(native)
    return root


@pytest.mark.parametrize("num_ranks", (1, 2, 3))
def test_mxnet_distributed(num_ranks, overlay, monkeypatch):
    # The MXNet environment's own mpirun: its ranks load that Open MPI.
    monkeypatch.setenv("TFRING_TEST_MPIRUN", str(VENV / "bin" / "mpirun"))
    # Run from the overlay: `python -m` puts the working folder first on
    # sys.path, where the tree's tfring (built for the main environment)
    # would shadow the overlay's.
    argv = [str(PYTHON), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
            "-c", str(REPO / "pytest.ini"), "--rootdir", str(REPO),
            "-o", f"faulthandler_timeout={STACK_DUMP_SECONDS}", *FILES]
    env = dict(os.environ, PYTHONPATH=str(overlay), OMP_NUM_THREADS="1",
               MXNET_CPU_WORKER_NTHREADS="1", PATH=f"{VENV / 'bin'}:{os.environ['PATH']}")
    env.pop("VIRTUAL_ENV", None)
    result = mpi_launch.launch(argv, num_ranks, TIMEOUT_SECONDS, env=env, cwd=str(overlay))
    assert result.returncode == 0 and not result.timed_out, result.describe()
