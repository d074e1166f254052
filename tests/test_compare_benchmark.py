# Runs benchmarks/compare.py --quick on a minimal subset of its rows (the
# 4 KiB allreduce and the small CNN's model.fit step; raw MPI, tfring and
# MultiWorkerMirroredStrategy with AUTO), so that a change to tfring, to
# TensorFlow or Keras, or to the benchmark that breaks a mode shows up here.
# It checks that the table has the expected rows with positive numbers; it
# makes no claim about which mode is faster (this machine may be busy).
# The ParameterServerStrategy, RING and ceiling modes and the ResNet-50 rows
# are left to the script itself: each adds 10-60 s of process start-up and
# tracing on a 2-core machine.

import json
import os
import subprocess
import sys

import mpi_launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "compare.py")
TIMEOUT_SECONDS = 240  # about 50 s on 2 idle cores

EXPECTED_ROWS = {
    ("4KiB", "mpi"), ("4KiB", "tfring"), ("4KiB", "mwms-auto"),
    ("cnn-fit", "tfring"), ("cnn-fit", "mwms-auto"),
}


def test_quick_subset_prints_every_row_with_positive_numbers(tmp_path):
    out = tmp_path / "compare.json"
    argv = [sys.executable, SCRIPT, "--quick", "--cases", "4KiB,cnn-fit",
            "--modes", "mpi,tfring,mwms-auto", "--json", str(out),
            "--show-failures"]
    result = subprocess.run(
        argv, cwd=REPO, env=mpi_launch.working_tree_env(quiet_tensorflow=True),
        capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]

    report = json.loads(out.read_text())
    rows = {(row["case"], row["mode"]): row for row in report["rows"]}
    assert set(rows) == EXPECTED_ROWS, output[-6000:]
    for key, row in rows.items():
        assert row["failure"] is None, (key, row["failure"])
        assert row["seconds"] > 0, key
        assert row["ratio_to_tfring"] > 0, key
    assert rows[("4KiB", "tfring")]["ratio_to_tfring"] == 1.0
    for mode in ("tfring", "mwms-auto"):
        assert rows[("cnn-fit", mode)]["img_per_sec"] > 0
    for mode in ("mpi", "tfring", "mwms-auto"):
        assert len(rows[("4KiB", mode)]["samples"]) == \
            report["settings"]["repeats"]

    # The printed table: a header with date and machine, one line per row,
    # and the footnote with the upstream issue of the MWMS workaround.
    assert "date: " in result.stdout and "machine: " in result.stdout
    table = result.stdout[result.stdout.index("workload"):]
    lines = table.splitlines()
    assert any(line.startswith("allreduce 4 KiB") and "raw MPI" in line
               for line in lines), table
    assert any(line.startswith("fit small CNN") and "tfring" in line
               for line in lines), table
    assert sum("MWMS" in line for line in lines) >= 2, table
    assert "https://github.com/keras-team/keras/issues/20585" in table
