"""The shared heap (tfring/shared_heap.cc), the malloc tfringrun preloads into one host's ranks.

Builds libtfring_shared_heap.so with setup.py's flags (and -Werror) and
tests/cc/shared_heap_test.cc, and runs each scenario with the library
preloaded: large blocks in the memfd and small ones with glibc, alignment,
best fit and merging, calloc zeroes, pages given back, realloc across the
threshold, threads, a full heap falling back to glibc, a peer mapping the
heap through /proc/<pid>/fd/<fd>, forked children on private copies, bad
frees aborting, the heap off, and the library out of LD_PRELOAD. Then real
programs under it: Python with numpy (big arrays in the heap, right values,
os.fork, subprocesses without it), the same with TFRING_SHARED_HEAP=0 (no
heap, everything works), and TensorFlow (a matmul and a small Keras fit)
when it is installed.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cc_test_binary import compile_binary, run_scenario, scenario_names

ROOT = Path(__file__).resolve().parent.parent
LIBRARY_SOURCE = ROOT / "tfring" / "shared_heap.cc"
TEST_SOURCE = ROOT / "tests" / "cc" / "shared_heap_test.cc"
# The scenarios end their own child processes; this only catches a hang.
SCENARIO_TIMEOUT_S = 120
PROGRAM_TIMEOUT_S = 300

# Reads tfring_shared_heap_info through ctypes (cc/shared_heap_info.h).
INFO_PRELUDE = r"""
import ctypes

class Info(ctypes.Structure):
    _fields_ = [("present", ctypes.c_int32), ("fd", ctypes.c_int32), ("pid", ctypes.c_int64),
                ("base", ctypes.c_void_p), ("capacity", ctypes.c_uint64),
                ("fallbacks", ctypes.c_uint64)]

def heap_info():
    info = Info()
    ctypes.CDLL(None).tfring_shared_heap_info(ctypes.byref(info))
    return info

def in_heap(address, info):
    return bool(info.present) and info.base <= address < info.base + info.capacity
"""

NUMPY_SCRIPT = INFO_PRELUDE + r"""
import os
import subprocess
import sys

import numpy as np

expect_heap = sys.argv[1] == "1"
library = sys.argv[2]
assert library not in os.environ.get("LD_PRELOAD", ""), os.environ.get("LD_PRELOAD")

n = 20_000_000
counting = np.arange(n, dtype=np.float64)                  # malloc
zeros = np.zeros((4000, 5000), dtype=np.float32)           # calloc
ones = np.ones(3_000_000, dtype=np.int64)
assert counting.sum() == n * (n - 1) / 2
assert not zeros.any()
assert ones.sum() == 3_000_000
doubled = counting * 2
assert (doubled - counting == counting).all()
info = heap_info()
assert info.present == int(expect_heap), info.present
for array in (counting, zeros, ones, doubled):
    assert in_heap(array.ctypes.data, info) == expect_heap, hex(array.ctypes.data)
small = np.arange(10)
assert not in_heap(small.ctypes.data, info)

# Many arrays made and dropped: the heap reuses its blocks.
for round in range(200):
    block = np.full(100_000 + round * 1_000, round, dtype=np.int32)
    assert block[-1] == round and block.sum() == round * block.size
    del block
grown = np.arange(100, dtype=np.int64)
grown.resize(5_000_000, refcheck=False)                   # realloc
assert grown[99] == 99 and grown[100] == 0 and grown[-1] == 0

# A forked child writes its copy; the parent's arrays do not change.
pid = os.fork()
if pid == 0:
    counting[:] = -1
    zeros[:] = 7
    child_info = heap_info()
    ok = child_info.present == 0 and (ones == 1).all() and counting[5] == -1
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
assert counting[5] == 5 and not zeros.any()

# What this process starts does not load the library.
shown = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD', ''))"],
                       capture_output=True, text=True, check=True).stdout
assert library not in shown, shown
print("numpy ok, present", heap_info().present, "fallbacks", heap_info().fallbacks)
"""

TENSORFLOW_SCRIPT = INFO_PRELUDE + r"""
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

x = tf.random.normal([1024, 1024], seed=1)
product = x @ x
total = float(tf.reduce_sum(product))
assert np.isfinite(total)
reference = x.numpy().astype(np.float64) @ x.numpy().astype(np.float64)
assert np.allclose(product.numpy(), reference, rtol=1e-3, atol=1e-2)
info = heap_info()
assert info.present == 1, info.present
# An eager CPU tensor's buffer is the heap's.
assert in_heap(np.asarray(product).ctypes.data, info), hex(np.asarray(product).ctypes.data)

features = np.random.default_rng(0).normal(size=(2048, 32)).astype(np.float32)
labels = features @ np.linspace(-1, 1, 32, dtype=np.float32)[:, None]
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(256, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
history = model.fit(features, labels, epochs=3, batch_size=64, verbose=0)
losses = history.history["loss"]
assert losses[-1] < losses[0], losses
print("tensorflow ok, loss", losses[0], "->", losses[-1], "fallbacks", heap_info().fallbacks)
"""


@pytest.fixture(scope="session")
def heap_library(tmp_path_factory):
    return compile_binary(tmp_path_factory.mktemp("shared_heap_lib") / "libtfring_shared_heap.so",
                          LIBRARY_SOURCE, [],
                          flags=("-O2", "-g0", "-shared", "-fPIC", "-fvisibility=hidden",
                                 "-Werror"),
                          libraries=["-Wl,--no-undefined", "-ldl", "-lpthread"])


@pytest.fixture(scope="session")
def heap_test_binary(tmp_path_factory):
    # -fno-builtin: the compiler must not drop or merge the allocations under test.
    return compile_binary(tmp_path_factory.mktemp("shared_heap") / "shared_heap_test",
                          TEST_SOURCE, [], flags=("-O1", "-g", "-fno-builtin", "-Werror"),
                          libraries=["-ldl"])


def preloaded(library, **extra):
    env = dict(os.environ, LD_PRELOAD=str(library), **extra)
    for name in ("TFRING_SHARED_HEAP", "TFRING_SHARED_HEAP_BYTES"):
        if name not in extra:
            env.pop(name, None)
    return env


def test_library_exports(heap_library):
    # Exactly what the loader and the core look for (default visibility).
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(heap_library)],
                             capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
    expected = {"malloc", "free", "calloc", "realloc", "posix_memalign", "aligned_alloc",
                "memalign", "valloc", "pvalloc", "malloc_usable_size", "free_sized",
                "free_aligned_sized", "tfring_shared_heap_info"}
    assert exported == expected


@pytest.mark.parametrize("scenario", scenario_names(TEST_SOURCE, "Scenarios() {"))
def test_shared_heap(heap_library, heap_test_binary, scenario):
    run_scenario(heap_test_binary, [scenario], f"PASS {scenario}", SCENARIO_TIMEOUT_S,
                 env=preloaded(heap_library))


def test_bench_runs(heap_library, heap_test_binary):
    # The timing probe: no numbers asserted, only that it runs.
    run_scenario(heap_test_binary, ["bench", "1000", "1024"], "heap present: 1",
                 SCENARIO_TIMEOUT_S, env=preloaded(heap_library))


def run_program(args, env):
    result = subprocess.run(args, capture_output=True, text=True, timeout=PROGRAM_TIMEOUT_S,
                            env=env)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


def test_numpy_under_the_heap(heap_library):
    output = run_program([sys.executable, "-c", NUMPY_SCRIPT, "1", str(heap_library)],
                         preloaded(heap_library))
    assert "numpy ok, present 1" in output


def test_numpy_with_the_heap_off(heap_library):
    output = run_program([sys.executable, "-c", NUMPY_SCRIPT, "0", str(heap_library)],
                         preloaded(heap_library, TFRING_SHARED_HEAP="0"))
    assert "numpy ok, present 0 fallbacks 0" in output


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow is not installed")
def test_tensorflow_under_the_heap(heap_library):
    output = run_program([sys.executable, "-c", TENSORFLOW_SCRIPT], preloaded(heap_library))
    assert "tensorflow ok" in output
