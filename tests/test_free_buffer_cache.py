"""The output buffer pool's policy (FreeBufferCache), without TensorFlow.

Compiles tests/cc/free_buffer_cache_test.cc with
tfring/ops/kernels/free_buffer_cache.cc and runs each case: the byte bound
holds over 300 distinct sizes, the most recently freed buffers are the ones
kept, steady loops reuse, idle buffers are released.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cc" / "free_buffer_cache_test.cc"
CASE_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def cache_test_binary(tmp_path_factory):
    binary = tmp_path_factory.mktemp("free_buffer_cache") / "free_buffer_cache_test"
    command = [os.environ.get("TFRING_CXX", "g++"), "-std=c++17", "-O1", "-g", "-Wall",
               "-I", str(ROOT), "-o", str(binary), str(TEST_SOURCE),
               str(ROOT / "tfring" / "ops" / "kernels" / "free_buffer_cache.cc")]
    compiled = subprocess.run(command, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    return binary


def _cases():
    # Read from the source so collection does not need a compiled binary.
    table = TEST_SOURCE.read_text().split("Cases() {", 1)[1].split("};", 1)[0]
    return [line.split('"')[1] for line in table.splitlines() if '"' in line]


@pytest.mark.parametrize("case", _cases())
def test_free_buffer_cache(cache_test_binary, case):
    result = subprocess.run([str(cache_test_binary), case], capture_output=True, text=True,
                            timeout=CASE_TIMEOUT_S)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"PASS {case}" in result.stdout
