"""setup.py's native build, exercised on a tiny throwaway project.

Copies setup.py next to a two-file core and a small front end in a temporary
directory, so the incremental logic can be tested (touch a header, change a
flag) without racing anyone building the real tree.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

API_H = """\
#ifndef TFRING_CC_API_H_
#define TFRING_CC_API_H_
#define TFRING_EXPORT __attribute__((visibility("default")))
namespace tfring {
TFRING_EXPORT int Answer();
int Hidden();  // not exported
}  // namespace tfring
#endif
"""

ANSWER_H = "#pragma once\nnamespace tfring { constexpr int kAnswer = 42; }\n"

CORE_CC = """\
#include "cc/api.h"
#include "cc/answer.h"
namespace tfring {
int Answer() { return kAnswer; }
int Hidden() { return 7; }
}  // namespace tfring
"""

OTHER_CC = '#include "cc/api.h"\nnamespace tfring { int Twice() { return 2 * Answer(); } }\n'

MODULE_OK = '#include "cc/api.h"\nint ModuleUsesCore() { return tfring::Answer(); }\n'
MODULE_BAD = '#include "cc/api.h"\nint ModuleUsesCore() { return tfring::Hidden(); }\n'


def build(project):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"],
                          cwd=project, capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - start


def compiled(proc):
    return sorted(line.split("compiled ", 1)[1].split(" (")[0]
                  for line in proc.stdout.splitlines() if "] compiled " in line)


def runpath(lib):
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "RUNPATH" in line:
            return line.split("[", 1)[1].rstrip("]")
    return None


@pytest.fixture
def project(tmp_path):
    (tmp_path / "cc").mkdir()
    (tmp_path / "tfring" / "binding").mkdir(parents=True)
    (tmp_path / "setup.py").write_text((ROOT / "setup.py").read_text())
    # setup.py reads the package version from here.
    (tmp_path / "tfring" / "_version.py").write_text(
        (ROOT / "tfring" / "_version.py").read_text())
    (tmp_path / "cc" / "api.h").write_text(API_H)
    (tmp_path / "cc" / "answer.h").write_text(ANSWER_H)
    (tmp_path / "cc" / "core.cc").write_text(CORE_CC)
    (tmp_path / "cc" / "other.cc").write_text(OTHER_CC)
    (tmp_path / "tfring" / "binding" / "core_module.cc").write_text(MODULE_OK)
    # Reuse the real tree's TensorFlow probe (importing TensorFlow takes seconds).
    probe = ROOT / "build" / "obj" / "tensorflow.json"
    if probe.is_file():
        (tmp_path / "build" / "obj").mkdir(parents=True)
        (tmp_path / "build" / "obj" / "tensorflow.json").write_bytes(probe.read_bytes())
    return tmp_path


def test_incremental_build(project):
    proc, _ = build(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert compiled(proc) == ["cc/core.cc", "cc/other.cc", "tfring/binding/core_module.cc"]
    core = project / "tfring" / "libtfring_core.so"
    assert core.is_file()
    assert (project / "tfring" / "_build_info.py").is_file()
    assert "skipping the op library" in proc.stdout

    # Nothing changed: no compiler, no linker, well under 2 s.
    proc, seconds = build(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert compiled(proc) == []
    assert "linked" not in proc.stdout
    assert "native build up to date" in proc.stdout
    assert seconds < 2.0, f"no-op rebuild took {seconds:.2f} s"

    # A header recompiles exactly the files that include it.
    (project / "cc" / "answer.h").write_text(ANSWER_H.replace("42", "43"))
    proc, _ = build(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert compiled(proc) == ["cc/core.cc"]
    assert "linked build/obj/out/inplace/tfring/libtfring_core.so" in proc.stdout

    # A new source file is picked up by the glob.
    (project / "cc" / "third.cc").write_text("namespace tfring { int Three() { return 3; } }\n")
    proc, _ = build(project)
    assert compiled(proc) == ["cc/third.cc"], proc.stdout + proc.stderr


def test_runpaths_and_soname(project):
    proc, _ = build(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    core = project / "tfring" / "libtfring_core.so"
    dynamic = subprocess.run(["readelf", "-d", str(core)], capture_output=True,
                             text=True).stdout
    assert "Library soname: [libtfring_core.so]" in dynamic
    # RUNPATH: the MPI libdir, relative to $ORIGIN when it is inside the venv.
    mpicxx = Path(sys.prefix) / "bin" / "mpicxx"
    if not mpicxx.exists() or os.environ.get("TFRING_MPICXX"):
        pytest.skip("MPI is not the environment's Open MPI wheel")
    libdirs = subprocess.run([str(mpicxx), "--showme:libdirs"], capture_output=True,
                             text=True).stdout.split()
    entries = runpath(core).split(":")
    for libdir in libdirs:
        assert os.path.realpath(libdir) in entries
        if os.path.realpath(libdir).startswith(os.path.realpath(sys.prefix)):
            relative = os.path.relpath(os.path.realpath(libdir), project / "tfring")
            assert "$ORIGIN/" + relative in entries
    module = next((project / "tfring").glob("_core.*.so"))
    assert runpath(module) == "$ORIGIN"
    exported = subprocess.run(["nm", "-D", "-C", "--defined-only", str(core)],
                              capture_output=True, text=True).stdout
    assert "tfring::Answer()" in exported
    assert "tfring::Hidden()" not in exported  # -fvisibility=hidden


def test_unexported_symbol_is_a_build_error(project):
    (project / "tfring" / "binding" / "core_module.cc").write_text(MODULE_BAD)
    proc, _ = build(project)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "does not export" in output and "tfring::Hidden()" in output, output
    assert "TFRING_EXPORT" in output
    # And it stays an error on the next run: no silent "up to date".
    proc, _ = build(project)
    assert proc.returncode != 0


def test_compile_error_names_the_file(project):
    (project / "cc" / "other.cc").write_text("this is not C++\n")
    proc, _ = build(project)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "FAILED cc/other.cc" in output
    assert "failed to compile cc/other.cc" in output


def test_without_tensorflow_only_the_core_and_module_build(project, tmp_path):
    # The MXNet environment has no TensorFlow (MXNet 1.9.1 needs NumPy <
    # 1.24): there setup.py builds the core and its module, says why the op
    # library is missing, and keeps its objects where TFRING_BUILD_DIR says.
    import mxnet_env
    if not mxnet_env.available():
        pytest.skip(mxnet_env.MISSING_REASON)
    (project / "tfring" / "ops" / "kernels").mkdir(parents=True)
    (project / "tfring" / "ops" / "kernels" / "op.cc").write_text("#error never compiled\n")
    env = dict(os.environ, TFRING_BUILD_DIR="build/obj-other")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(mxnet_env.PYTHON), "setup.py", "build_ext", "--inplace"],
                          cwd=project, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TensorFlow is not importable" in proc.stdout, proc.stdout
    assert (project / "tfring" / "libtfring_core.so").is_file()
    assert not (project / "tfring" / "ops" / "libtfring_ops.so").exists()
    assert (project / "build" / "obj-other" / "cc" / "core.cc.o").is_file()
    assert "TF_VERSION = None" in (project / "tfring" / "_build_info.py").read_text()
