# The MXNet environment for the tests that run tfring.mxnet (MXNet 1.9.1
# needs NumPy < 1.24, which TensorFlow 2.21 cannot share, so its Python is
# .venv-mxnet's, made by tools/install.sh).
#
# Why an overlay: the ranks run this working tree's Python sources over the
# native libraries installed in .venv-mxnet (built there without
# TensorFlow): a folder holds a copy of tfring/*.py and links to those
# libraries, so a change to the Python layer is tested without
# reinstalling; a change to the C++ core needs tools/install.sh again.

import os
import pathlib
import shutil
import subprocess

REPO = pathlib.Path(__file__).resolve().parent.parent
VENV = pathlib.Path(os.environ.get("TFRING_MXNET_VENV", REPO / ".venv-mxnet"))
PYTHON = VENV / "bin" / "python"
MISSING_REASON = (f"no MXNet environment at {VENV} (tools/install.sh makes it; "
                  "TFRING_SKIP_MXNET=1 skips that step)")


def available():
    return PYTHON.is_file()


def _installed_package():
    found = subprocess.run(
        [str(PYTHON), "-c", "import tfring, os; print(os.path.dirname(tfring.__file__))"],
        cwd="/", capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, (
        "tfring is not installed in the MXNet environment: run tools/install.sh\n"
        + found.stderr[-2000:])
    return pathlib.Path(found.stdout.strip())


def make_overlay(root):
    """Fills `root` with a tfring package: this tree's Python, the MXNet
    environment's native libraries; returns `root`."""
    installed = _installed_package()
    shutil.copytree(REPO / "tfring", root / "tfring",
                    ignore=shutil.ignore_patterns("*.so", "_build_info.py", "__pycache__"))
    for native in [*installed.rglob("*.so"), installed / "_build_info.py"]:
        target = root / "tfring" / native.relative_to(installed)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(native)
    return root


def rank_env(overlay, monkeypatch):
    """The environment of MXNet ranks (run them with cwd=overlay: `python -m`
    and scripts put their folder first on sys.path, where the tree's tfring,
    built for the main environment, must not shadow the overlay's)."""
    # The MXNet environment's own mpirun: its ranks load that Open MPI.
    monkeypatch.setenv("TFRING_TEST_MPIRUN", str(VENV / "bin" / "mpirun"))
    env = dict(os.environ, PYTHONPATH=str(overlay), OMP_NUM_THREADS="1",
               MXNET_CPU_WORKER_NTHREADS="1", PATH=f"{VENV / 'bin'}:{os.environ['PATH']}")
    env.pop("VIRTUAL_ENV", None)
    return env
