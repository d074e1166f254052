"""OMPI_MCA_mpi_yield_when_idle (tfring/_mpi_yield.py): Open MPI yields
while a rank waits, and only this process's MPI sees the setting.

Each case runs a fresh Python with this tree first on its path and reads
back what Open MPI took (the mpi_yield_when_idle control variable, through
the MPI tool interface) and what the environment holds. Before, `import
tfring` wrote the variable into os.environ of every process that imported
it, so every child process inherited it.
"""
import os
import subprocess
import sys

import pytest

import mpi_launch

VARIABLE = "OMPI_MCA_mpi_yield_when_idle"

# Prints the environment's value (after import tfring, after MPI started)
# and Open MPI's own value of mpi_yield_when_idle (a bool control variable).
PROBE = r"""
import ctypes, os, subprocess, sys
mode = sys.argv[1]
if mode == "rc":
    import mpi4py
    mpi4py.rc.initialize = False
import tfring
print("AFTER_IMPORT", os.environ.get("OMPI_MCA_mpi_yield_when_idle"))
from mpi4py import MPI
if mode == "rc":
    tfring.init()
print("MPI_STARTED", MPI.Is_initialized(), os.environ.get("OMPI_MCA_mpi_yield_when_idle"))
child = subprocess.run([sys.executable, "-c",
                        "import os; print(os.environ.get('OMPI_MCA_mpi_yield_when_idle'))"],
                       capture_output=True, text=True).stdout.strip()
print("CHILD", child)
lib = ctypes.CDLL(MPI.__file__)  # libmpi is loaded; its symbols are visible through here
provided = ctypes.c_int()
assert lib.MPI_T_init_thread(MPI.THREAD_SINGLE, ctypes.byref(provided)) == 0
index, count = ctypes.c_int(), ctypes.c_int()
assert lib.MPI_T_cvar_get_index(b"mpi_yield_when_idle", ctypes.byref(index)) == 0
handle = ctypes.c_void_p()
assert lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) == 0
value = ctypes.c_int(0)
assert lib.MPI_T_cvar_read(handle, ctypes.byref(value)) == 0
print("OPEN_MPI_YIELDS", value.value & 0xFF)
if mode == "rc":
    tfring.shutdown()
"""


def _probe(mode, **environment):
    env = mpi_launch.working_tree_env()
    env.pop(VARIABLE, None)
    env.update(environment)
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines()
                if line.split(" ", 1)[0].isupper())


@pytest.mark.parametrize("mode", ["import", "rc"])
def test_only_this_processes_mpi_sees_the_setting(mode):
    # "import": the script imports mpi4py.MPI after tfring, which starts
    # MPI; "rc": mpi4py.rc.initialize = False, so tfring.init() starts it.
    seen = _probe(mode)
    assert seen["AFTER_IMPORT"] == "None", seen
    assert seen["MPI_STARTED"] == "True None", seen
    assert seen["CHILD"] == "None", seen
    assert seen["OPEN_MPI_YIELDS"] == "1", seen


def test_a_value_the_user_set_is_kept():
    seen = _probe("import", **{VARIABLE: "0"})
    assert seen["AFTER_IMPORT"] == "0" and seen["CHILD"] == "0", seen
    assert seen["OPEN_MPI_YIELDS"] == "0", seen
