"""The shared-memory engine (cc/shm/shm_collectives.cc, cc/shm/shm_barrier.cc, cc/shm/shm_segment.cc).

Compiles tests/cc/shm_collectives_test.cc with only the core files it needs
(no MPI) and runs each scenario, ranks as processes: allreduce of every op
and dtype at 1 to 3 ranks on odd counts up to many chunks, chunked, in place
and staged, bitwise against a reference and across ranks; reduce-scatter
at 1 to 4 (and 10) ranks into uneven, empty and piece-boundary slices, each
slice the allreduce's bits and nothing else written; thousands of mixed
calls; broadcast from every root; allgatherv of uneven parts; exchange
up to its capacity; the barrier across processes, and its one outcome for
every rank when a late peer comes after the others gave up; a peer killed
during an allreduce, a reduce-scatter or an exchange, and a peer that stops
taking part (Aborted, naming its job rank); argument and segment errors.
The dead-peer
scenarios run again in a build that sleeps between a rank's two arrival
stores, so a kill lands there every time (a rank that died there was once
waited for as if it had arrived).
"""
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "shm_collectives_test.cc"
# logging.cc needs config.cc, and both need common.cc.
CORE_SOURCES = ["shm/shm_segment.cc", "shm/shm_barrier.cc", "shm/shm_collectives.cc",
                "reduce_kernels.cc", "logging.cc", "config.cc", "common.cc"]
# A scenario's processes are killed after 30-60 s by the test itself; this
# only catches the test binary hanging.
SCENARIO_TIMEOUT_S = 120


def _compile(tmp_path_factory, folder, *defines):
    return compile_binary(tmp_path_factory.mktemp(folder) / "shm_collectives_test",
                          TEST_SOURCE, [ROOT / "cc" / name for name in CORE_SOURCES],
                          flags=("-O2", "-Werror", *defines),
                          libraries=["-lrt"])  # shm_open lives in librt before glibc 2.34


@pytest.fixture(scope="session")
def shm_test_binary(tmp_path_factory):
    return _compile(tmp_path_factory, "shm_collectives")


@pytest.fixture(scope="session")
def shm_test_binary_with_wide_arrival(tmp_path_factory):
    return _compile(tmp_path_factory, "shm_wide_arrival", "-DTFRING_TEST_ARRIVAL_WINDOW_US=200")


@pytest.mark.parametrize("scenario", scenario_names(TEST_SOURCE, "Scenarios() {"))
def test_shm_collectives(shm_test_binary, scenario):
    run_scenario(shm_test_binary, [scenario], f"PASS {scenario}", SCENARIO_TIMEOUT_S)


@pytest.mark.parametrize("scenario", ["dead_peer_allreduce", "dead_peer_reduce_scatter",
                                      "dead_peer_exchange"])
def test_a_peer_killed_while_arriving_is_noticed(shm_test_binary_with_wide_arrival, scenario):
    run_scenario(shm_test_binary_with_wide_arrival, [scenario], f"PASS {scenario}",
                 SCENARIO_TIMEOUT_S)


def test_bench_runs(shm_test_binary):
    # The timing probe: no numbers asserted, only that it runs.
    run_scenario(shm_test_binary, ["bench", "2", "2", "256"], "memcpy", SCENARIO_TIMEOUT_S)
