"""The autotuner's search and trial bookkeeping (TFRING_AUTOTUNE), in one process.

Compiles tests/cc/autotune_test.cc with only the sources it needs
(cc/tuning/bayesian_optimizer.cc, cc/tuning/autotuner.cc and the logging they use; no MPI)
under -Wall -Werror, and runs each scenario: Bayesian optimisation beats a
grid and random search on noisy synthetic objectives, the tuner finds the
optimum of a simulated job, fixed knobs stay fixed, warm-up and transition
samples never count, and the CSV log is complete and within bounds (or
missing, with one warning, when its path cannot be written).
"""
import os
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "autotune_test.cc"
# logging.cc reads the log level through config.cc.
CORE_SOURCES = ["tuning/bayesian_optimizer.cc", "tuning/autotuner.cc", "output_file.cc",
                "logging.cc", "config.cc"]
SCENARIO_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def autotune_binary(tmp_path_factory):
    return compile_binary(tmp_path_factory.mktemp("autotune") / "autotune_test", TEST_SOURCE,
                          [ROOT / "cc" / name for name in CORE_SOURCES],
                          flags=("-O1", "-g", "-Werror"))


@pytest.mark.parametrize("scenario", scenario_names(TEST_SOURCE, "scenarios = {"))
def test_autotune(autotune_binary, scenario, tmp_path):
    # The unwritable-log scenario reads the warning: keep warnings enabled
    # whatever the caller's environment says.
    env = dict(os.environ, TFRING_LOG_LEVEL="warning")
    run_scenario(autotune_binary, [scenario, str(tmp_path)], f"PASS {scenario}",
                 SCENARIO_TIMEOUT_S, env=env)
