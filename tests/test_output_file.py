"""The files the core writes at a user's path (cc/output_file.cc): the
timeline and the autotuner's log.

Compiles tests/cc/output_file_test.cc with cc/output_file.cc and the
timeline, and runs each scenario in a scratch directory of its own: a
symbolic link at the path is refused (a dangling one too) and its target
left alone, with an error naming the path and the setting; a FIFO or a
directory is refused without blocking; new files are created 0600, existing
ones truncated with their mode kept. The same refusal in a running job (the
variable and tfring.start_timeline()) is in
tests/test_tuning_and_timeline_jobs.py.
"""
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "output_file_test.cc"
CORE_SOURCES = ["output_file.cc", "timeline/timeline.cc", "logging.cc", "config.cc",
                "common.cc"]
SCENARIO_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def output_file_binary(tmp_path_factory):
    return compile_binary(tmp_path_factory.mktemp("output_file") / "output_file_test",
                          TEST_SOURCE, [ROOT / "cc" / name for name in CORE_SOURCES],
                          flags=("-O1", "-g", "-Werror"))


@pytest.mark.parametrize("scenario", scenario_names(TEST_SOURCE, "Scenarios() {"))
def test_output_file(output_file_binary, scenario, tmp_path):
    run_scenario(output_file_binary, [scenario, str(tmp_path)], f"PASS {scenario}",
                 SCENARIO_TIMEOUT_S)
