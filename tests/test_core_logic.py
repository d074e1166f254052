"""Core negotiation, validation, fusion and cache logic, in one process.

Compiles tests/cc/core_logic_test.cc with the framework-neutral core sources
(everything in cc/ except the MPI transport and the MPI-backed global state)
and runs each scenario with ranks as threads over the loopback transport, for
world sizes 1 to 8.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPI_ONLY_SOURCES = {"mpi_transport.cc", "operations.cc"}
WORLD_SIZES = range(1, 9)
# Scenarios that also run at larger world sizes (ranks are threads, so this
# is cheap): integer Average was wrong at sizes such as 49.
EXTRA_SIZES = {"integer_average": (49, 200)}
SCENARIO_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def core_logic_binary(tmp_path_factory):
    binary = tmp_path_factory.mktemp("core_logic") / "core_logic_test"
    sources = [str(p) for p in sorted((ROOT / "cc").glob("*.cc"))
               if p.name not in MPI_ONLY_SOURCES]
    command = [os.environ.get("TFRING_CXX", "g++"), "-std=c++17", "-O1", "-g", "-pthread",
               "-Wall", "-I", str(ROOT), "-o", str(binary),
               str(ROOT / "tests" / "cc" / "core_logic_test.cc"), *sources]
    compiled = subprocess.run(command, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    return binary


def _scenarios():
    # The list lives in the C++ file; read it from the source so collection
    # does not need a compiled binary.
    source = (ROOT / "tests" / "cc" / "core_logic_test.cc").read_text()
    table = source.split("scenarios = {", 1)[1].split("};", 1)[0]
    return [line.split('"')[1] for line in table.splitlines() if '"' in line]


def _cases():
    return [(scenario, size) for scenario in _scenarios()
            for size in (*WORLD_SIZES, *EXTRA_SIZES.get(scenario, ()))]


@pytest.mark.parametrize("scenario,world_size", _cases())
def test_core_logic(core_logic_binary, scenario, world_size):
    result = subprocess.run([str(core_logic_binary), scenario, str(world_size)],
                            capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"PASS {scenario} size={world_size}" in result.stdout
