"""The knob table (cc/config.h): bounds, non-finite numbers and Horovod's
variable names, in one process.

Compiles tests/cc/config_test.cc with cc/config.cc alone and runs each
scenario: every knob's largest value is taken and anything above it (also
beyond int64) refused with a warning naming the variable; nan and inf are
refused; each HOROVOD_* name of a knob sets it in Horovod's units, TFRING_*
wins over it with one note when they differ; unsupported HOROVOD_* variables
are named in one note, build-time ones apart. Multi-rank behaviour (rank 0
warns once per job, values read back through tfring._core.config()) is in
tests/test_horovod_environment.py.
"""
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "config_test.cc"
SCENARIO_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def config_binary(tmp_path_factory):
    return compile_binary(tmp_path_factory.mktemp("config") / "config_test", TEST_SOURCE,
                          [ROOT / "cc" / "config.cc"], flags=("-O1", "-g", "-Werror"))


@pytest.mark.parametrize("scenario", scenario_names(TEST_SOURCE, "Scenarios() {"))
def test_config(config_binary, scenario):
    run_scenario(config_binary, [scenario], f"PASS {scenario}", SCENARIO_TIMEOUT_S)
