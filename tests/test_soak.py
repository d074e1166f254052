# Runs a short benchmarks/soak at 3 ranks, as CI does, so that a change
# that breaks a result, leaks, or hangs under mixed concurrent collectives
# shows up here; and a second run with the soak's hidden self-tests (a wrong
# reference value, and a memory, thread and fd leak planted after the
# warm-up) to show that each of its checks can fail.
#
# A 60-step run is mostly first-time costs (tf.function traces, TensorFlow
# kernels for new tensor names), so its memory baseline is taken after 40
# steps; the full 2,000-step run's warm-up is 500 (docs/benchmarks.md, "Soak").

import json
import pathlib
import re
import sys

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "soak"
RANKS = 3
# About 20 s on 2 idle cores (15 s of it TensorFlow starting); generous for
# a busy machine. --step-timeout aborts a hung job well before this.
TIMEOUT_SECONDS = 300
STEP_TIMEOUT = "120"

APIS = {"allreduce", "grouped_allreduce", "allgather", "grouped_allgather",
        "broadcast", "alltoall", "reducescatter", "grouped_reducescatter"}
DTYPES = {"uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
          "bfloat16", "float32", "float64", "bool"}


def _run(tmp_path, *args):
    report_path = tmp_path / "soak.json"
    argv = [sys.executable, str(SCRIPT), "--step-timeout", STEP_TIMEOUT,
            "--json", str(report_path), *args]
    result = mpi_launch.launch(
        argv, RANKS, TIMEOUT_SECONDS,
        env=mpi_launch.working_tree_env(quiet_tensorflow=True), cwd=str(REPO))
    assert not result.timed_out, result.describe()
    assert report_path.is_file(), result.describe()
    return result, json.loads(report_path.read_text())


def test_short_soak_passes_every_check(tmp_path):
    result, report = _run(tmp_path, "--steps", "60", "--warmup-steps", "40")
    assert result.returncode == 0, result.describe()
    assert "SOAK PASSED" in result.output, result.describe()
    assert report["passed"], result.describe()
    assert report["settings"]["size"] == RANKS
    checks = report["checks"]
    assert {name for name, c in checks.items() if c["passed"]} == {
        "results", "memory", "threads", "fds"}

    results = checks["results"]
    checked = set(results["tensors_checked"].values())
    assert len(checked) == 1, results  # every rank checked every tensor
    assert checked.pop() > 500, results
    assert set(results["steps_done"].values()) == {60}
    assert set(results["mismatches"].values()) == {0}
    assert set(results["errors"].values()) == {0}

    coverage = report["coverage"]
    assert set(coverage["calls by API"]) == APIS, coverage
    assert set(coverage["tensors by dtype"]) == DTYPES, coverage
    assert set(coverage["reductions by op"]) >= {
        f"allreduce {op}" for op in ("Sum", "Average", "Min", "Max",
                                     "Product")}, coverage
    assert {"eager, main lane", "eager, thread lane", "tf.function, main lane",
            "tf.function, thread lane"} <= set(coverage["items"]), coverage
    assert coverage["other"]["zero-size tensors"] > 0, coverage

    for rank, memory in checks["memory"]["per_rank"].items():
        assert memory["end_mib"] > 0, (rank, memory)
        assert memory["growth_after_warmup_mib"] <= 50, (rank, memory)
    windows = report["step_time"]["windows"]
    assert windows and all(w["median_ms"] > 0 for w in windows), windows


def test_soak_fails_on_a_wrong_reference_and_planted_leaks(tmp_path):
    result, report = _run(
        tmp_path, "--steps", "12", "--warmup-steps", "4", "--self-test",
        "corrupt-reference,leak-memory,leak-thread,leak-fd")
    assert result.returncode != 0, result.describe()
    assert "SOAK FAILED: results, memory, threads, fds" in result.output, (
        result.describe())
    assert not report["passed"]
    checks = report["checks"]
    assert not any(c["passed"] for c in checks.values()), checks

    # One output of the last rank was compared with a changed reference
    # from the middle of the run on; the failure names where it happened.
    assert checks["results"]["mismatches"] == {"0": 0, "1": 0, "2": 1}
    [failure] = report["failures"]
    match = re.match(r"MISMATCH step (\d+), rank 2, item \d+ \(", failure)
    assert match and int(match.group(1)) >= 6, failure
    assert "dtype " in failure and "differ" in failure, failure
    assert f"soak: {failure}" in result.output  # printed at once, loudly

    for rank, memory in checks["memory"]["per_rank"].items():
        assert memory["growth_after_warmup_mib"] > 50, (rank, memory)
    for rank, threads in checks["threads"]["per_rank"].items():
        assert threads["python"]["end"] == threads["python"]["warmup"] + 1
        assert threads["tasks"]["end"] == threads["tasks"]["warmup"] + 1
    for rank, fds in checks["fds"]["per_rank"].items():
        assert fds["end"] == fds["warmup"] + 1, (rank, fds)
