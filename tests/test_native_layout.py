"""The built native artefacts: sonames, dependencies and RUNPATHs (docs/layout.md).

Checks the in-tree build (what `python -m pytest` from the repo root imports)
and, when tfring is also installed into this environment, the installed copy.
"""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def dynamic_section(lib):
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    needed, runpath, soname = [], [], None
    for line in out.splitlines():
        value = line.split("[", 1)[-1].rstrip("]")
        if "(NEEDED)" in line:
            needed.append(value)
        elif "(RUNPATH)" in line:
            runpath = value.split(":")
        elif "(SONAME)" in line:
            soname = value
    return needed, runpath, soname


def package_dirs():
    dirs = [ROOT / "tfring"]
    installed = Path(sysconfig.get_paths()["platlib"]) / "tfring"
    if (installed / "libtfring_core.so").exists() and installed not in dirs:
        dirs.append(installed)
    return dirs


@pytest.fixture(params=package_dirs(), ids=lambda d: "in-tree" if d == ROOT / "tfring"
                else "installed")
def package(request):
    if not (request.param / "libtfring_core.so").exists():
        pytest.fail(f"{request.param}/libtfring_core.so is missing: run tools/install.sh")
    return request.param


def test_core(package):
    needed, runpath, soname = dynamic_section(package / "libtfring_core.so")
    assert soname == "libtfring_core.so"
    libmpi = [n for n in needed if n.startswith("libmpi")]
    assert libmpi, needed
    # RUNPATH finds libmpi, through an $ORIGIN-relative entry first when MPI
    # lives in this environment (the Open MPI wheel).
    found = [p for p in runpath
             if os.path.isfile(os.path.join(p.replace("$ORIGIN", str(package)), libmpi[0]))]
    assert found, runpath
    mpi_dir = os.path.realpath(os.path.join(found[0].replace("$ORIGIN", str(package))))
    if mpi_dir.startswith(os.path.realpath(sys.prefix) + os.sep):
        assert found[0].startswith("$ORIGIN/"), runpath


def test_python_module(package):
    module = package / ("_core" + EXT_SUFFIX)
    needed, runpath, _ = dynamic_section(module)
    assert "libtfring_core.so" in needed
    assert runpath == ["$ORIGIN"]


def test_op_library(package):
    needed, runpath, _ = dynamic_section(package / "ops" / "libtfring_ops.so")
    assert "libtfring_core.so" in needed
    assert any(n.startswith("libtensorflow_framework") for n in needed)
    assert runpath[:2] == ["$ORIGIN/..", "$ORIGIN/../../tensorflow"], runpath


def test_ldd_resolves_everything(package):
    for lib in [package / "libtfring_core.so", package / ("_core" + EXT_SUFFIX),
                package / "ops" / "libtfring_ops.so"]:
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
        assert "not found" not in out, f"{lib}:\n{out}"


def test_one_core_per_process(package):
    """The module and the op library bind to one mapping of the core."""
    code = f"""
import importlib.util, sys
import tensorflow as tf
spec = importlib.util.spec_from_file_location("tfring._core", {str(package / ("_core" + EXT_SUFFIX))!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
tf.load_op_library({str(package / "ops" / "libtfring_ops.so")!r})
maps = {{line.split()[-1] for line in open("/proc/self/maps") if "libtfring_core" in line}}
print("CORES", len(maps), sorted(maps))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CORES 1 " in proc.stdout, proc.stdout
