"""The shared-memory allreduce engine (cc/shm_allreduce.cc, cc/shm_segment.cc).

Compiles tests/cc/shm_allreduce_test.cc with only the core files it needs (no
MPI) and runs each scenario: every op and dtype at 1 to 4 ranks (threads) with
odd counts, bitwise against a reference; thousands of consecutive calls; in
place; tiny chunks; a peer that never arrives (Aborted, naming it, within the
timeout); segment errors (missing, duplicate, too large for /dev/shm).
"""
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "shm_allreduce_test.cc"
CORE_SOURCES = ["shm_segment.cc", "shm_allreduce.cc", "reduce_kernels.cc", "logging.cc",
                "config.cc", "common.cc"]
SCENARIO_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def shm_test_binary(tmp_path_factory):
    return compile_binary(tmp_path_factory.mktemp("shm_allreduce") / "shm_allreduce_test",
                          TEST_SOURCE, [ROOT / "cc" / name for name in CORE_SOURCES],
                          flags=("-O2", "-Werror"),
                          libraries=["-lrt"])  # shm_open lives in librt before glibc 2.34


@pytest.mark.parametrize("scenario", scenario_names(TEST_SOURCE, "Scenarios() {"))
def test_shm_allreduce(shm_test_binary, scenario):
    run_scenario(shm_test_binary, [scenario], f"PASS {scenario}", SCENARIO_TIMEOUT_S)


def test_bench_runs(shm_test_binary):
    # The bandwidth probe: no numbers asserted, only that it runs.
    run_scenario(shm_test_binary, ["bench", "2", "4", "256"], "GB/s", SCENARIO_TIMEOUT_S)
