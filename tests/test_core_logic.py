"""Core negotiation, validation, fusion and cache logic, in one process.

Compiles tests/cc/core_logic_test.cc with the framework-neutral core sources
(everything in cc/ except the MPI transport and the MPI-backed global state)
and runs each scenario with ranks as threads over the loopback transport, for
world sizes 1 to 8.
"""
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "core_logic_test.cc"
MPI_ONLY_SOURCES = {"mpi_transport.cc", "mpi_failures.cc", "operations.cc", "data_path.cc"}
WORLD_SIZES = range(1, 9)
# Scenarios that also run at larger world sizes (ranks are threads, so this
# is cheap): integer Average was wrong at sizes such as 49.
EXTRA_SIZES = {"integer_average": (49, 200)}
SCENARIO_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def core_logic_binary(tmp_path_factory):
    sources = [p for p in sorted((ROOT / "cc").rglob("*.cc")) if p.name not in MPI_ONLY_SOURCES]
    return compile_binary(tmp_path_factory.mktemp("core_logic") / "core_logic_test",
                          TEST_SOURCE, sources)


def _cases():
    return [(scenario, size) for scenario in scenario_names(TEST_SOURCE, "scenarios = {")
            for size in (*WORLD_SIZES, *EXTRA_SIZES.get(scenario, ()))]


@pytest.mark.parametrize("scenario,world_size", _cases())
def test_core_logic(core_logic_binary, scenario, world_size):
    run_scenario(core_logic_binary, [scenario, str(world_size)],
                 f"PASS {scenario} size={world_size}", SCENARIO_TIMEOUT_S)
