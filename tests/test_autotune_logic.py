"""The autotuner's search and trial bookkeeping (TFRING_AUTOTUNE), in one process.

Compiles tests/cc/autotune_test.cc with only the sources it needs
(cc/bayesian_optimizer.cc, cc/autotuner.cc and the logging they use; no MPI)
under -Wall -Werror, and runs each scenario: Bayesian optimisation beats a
grid and random search on noisy synthetic objectives, the tuner finds the
optimum of a simulated job, fixed knobs stay fixed, warm-up and transition
samples never count, and the CSV log is complete and within bounds (or
missing, with one warning, when its path cannot be written).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "autotune_test.cc"
# logging.cc reads the log level through config.cc.
CORE_SOURCES = ["bayesian_optimizer.cc", "autotuner.cc", "logging.cc", "config.cc"]
SCENARIO_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def autotune_binary(tmp_path_factory):
    binary = tmp_path_factory.mktemp("autotune") / "autotune_test"
    command = [os.environ.get("TFRING_CXX", "g++"), "-std=c++17", "-O1", "-g", "-Wall",
               "-Werror", "-I", str(ROOT), "-o", str(binary), str(TEST_SOURCE),
               *(str(ROOT / "cc" / name) for name in CORE_SOURCES)]
    compiled = subprocess.run(command, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    return binary


def _scenarios():
    # The list lives in the C++ file; read it from the source so collection
    # does not need a compiled binary.
    table = TEST_SOURCE.read_text().split("scenarios = {", 1)[1].split("};", 1)[0]
    return [line.split('"')[1] for line in table.splitlines() if '"' in line]


@pytest.mark.parametrize("scenario", _scenarios())
def test_autotune(autotune_binary, scenario, tmp_path):
    # The unwritable-log scenario reads the warning: keep warnings enabled
    # whatever the caller's environment says.
    env = dict(os.environ, TFRING_LOG_LEVEL="warning")
    result = subprocess.run([str(autotune_binary), scenario, str(tmp_path)], capture_output=True,
                            text=True, timeout=SCENARIO_TIMEOUT_S, env=env)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"PASS {scenario}" in result.stdout
