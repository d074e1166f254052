"""The wire codec and the compressed cross-host sum of the core, in one
process: bfloat16 rounding, float16 conversion and its per-block scale (no
overflow on 1e30), round-trip bounds, and the cross-host sum with ranks as
threads over loopback worlds (identical bits on every rank, within the
encodings' bounds of the float64 sum; one host exactly the uncompressed sum;
bf16 sums the same bits wherever the chunk boundaries fall); the measured
choice between the flat and hierarchical paths (the faster per MB after the
warm-up, exact sums throughout, the same path on every rank).
"""
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "wire_compression_test.cc"
SOURCES = ["cc/transport/wire_codec.cc", "cc/transport/cross_host_sum.cc",
           "cc/transport/hierarchical_transport.cc", "cc/transport/loopback_transport.cc",
           "cc/transport/path_trial.cc",
           "cc/reduce_kernels.cc", "cc/common.cc", "cc/logging.cc", "cc/config.cc"]
# Scenarios with ranks: world sizes; the others run once.
WORLD_SIZES = {"cross_host_sum": (1, 2, 3, 4), "compressed_hierarchical_allreduce": (1, 2, 4, 6),
               "bf16_sum_ignores_layout": (2, 3),
               "measured_path_is_exact_and_agreed": (2, 3, 4, 6)}


@pytest.fixture(scope="session")
def wire_binary(tmp_path_factory):
    return compile_binary(tmp_path_factory.mktemp("wire") / "wire_compression_test",
                          TEST_SOURCE, [ROOT / s for s in SOURCES])


def _cases():
    return [(scenario, size) for scenario in scenario_names(TEST_SOURCE, "scenarios = {")
            for size in WORLD_SIZES.get(scenario, (1,))]


@pytest.mark.parametrize("scenario,world_size", _cases())
def test_wire_compression(wire_binary, scenario, world_size):
    run_scenario(wire_binary, [scenario, str(world_size)],
                 f"PASS {scenario} size={world_size}", 120)
