"""The output buffer pool's policy (FreeBufferCache), without TensorFlow.

Compiles tests/cc/free_buffer_cache_test.cc with
tfring/ops/kernels/free_buffer_cache.cc and runs each case: the byte bound
holds over 300 distinct sizes, the most recently freed buffers are the ones
kept, steady loops reuse, idle buffers are released.
"""
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "free_buffer_cache_test.cc"
CASE_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def cache_test_binary(tmp_path_factory):
    return compile_binary(
        tmp_path_factory.mktemp("free_buffer_cache") / "free_buffer_cache_test", TEST_SOURCE,
        [ROOT / "tfring" / "ops" / "kernels" / "free_buffer_cache.cc"])


@pytest.mark.parametrize("case", scenario_names(TEST_SOURCE, "Cases() {"))
def test_free_buffer_cache(cache_test_binary, case):
    run_scenario(cache_test_binary, [case], f"PASS {case}", CASE_TIMEOUT_S)
