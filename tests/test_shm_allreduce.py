"""The shared-memory allreduce engine (cc/shm_allreduce.cc, cc/shm_segment.cc).

Compiles tests/cc/shm_allreduce_test.cc with only the core files it needs (no
MPI) and runs each scenario: every op and dtype at 1 to 4 ranks (threads) with
odd counts, bitwise against a reference; thousands of consecutive calls; in
place; tiny chunks; a peer that never arrives (Aborted, naming it, within the
timeout); segment errors (missing, duplicate, too large for /dev/shm).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "shm_allreduce_test.cc"
CORE_SOURCES = ["shm_segment.cc", "shm_allreduce.cc", "reduce_kernels.cc", "logging.cc",
                "config.cc", "common.cc"]
SCENARIO_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def shm_test_binary(tmp_path_factory):
    binary = tmp_path_factory.mktemp("shm_allreduce") / "shm_allreduce_test"
    command = [os.environ.get("TFRING_CXX", "g++"), "-std=c++17", "-O2", "-pthread", "-Wall",
               "-Werror", "-I", str(ROOT), "-o",
               str(binary), str(TEST_SOURCE)]
    command += [str(ROOT / "cc" / name) for name in CORE_SOURCES]
    command += ["-lrt"]  # shm_open lives in librt before glibc 2.34
    compiled = subprocess.run(command, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    return binary


def _scenarios():
    # Read from the source so collection does not need a compiled binary.
    table = TEST_SOURCE.read_text().split("Scenarios() {", 1)[1].split("};", 1)[0]
    return [line.split('"')[1] for line in table.splitlines() if '{"' in line]


@pytest.mark.parametrize("scenario", _scenarios())
def test_shm_allreduce(shm_test_binary, scenario):
    result = subprocess.run([str(shm_test_binary), scenario], capture_output=True, text=True,
                            timeout=SCENARIO_TIMEOUT_S)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"PASS {scenario}" in result.stdout


def test_bench_runs(shm_test_binary):
    # The bandwidth probe: no numbers asserted, only that it runs.
    result = subprocess.run([str(shm_test_binary), "bench", "2", "4", "256"],
                            capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "GB/s" in result.stdout
