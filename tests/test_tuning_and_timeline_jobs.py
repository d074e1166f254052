"""TFRING_AUTOTUNE and TFRING_TIMELINE in real jobs at 2 and 3 ranks.

One job per size runs allreduce steps (tests/job_scripts/
tuned_training_steps.py) with the autotuner searching and the timeline
recording, both set by environment. Checks: results stay right on every rank
while the thresholds change; the autotuner's CSV log has every trial and the
final choice, never moves the knob the user set (TFRING_CYCLE_TIME) and stays
within the fusion buffer; the timeline file is valid JSON after an exit
without tfring.shutdown(), with every step's tensors and every rank's
readiness, and the summary tool reads it.
"""
import csv
import json
import os
import sys
from pathlib import Path

import pytest

import mpi_launch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "job_scripts" / "tuned_training_steps.py"
STEPS = 300
TENSORS_PER_STEP = 5
MAX_TRIALS = 6
DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024
JOB_TIMEOUT_S = 300

sys.path.insert(0, str(ROOT))
from tfring import timeline as timeline_tool  # noqa: E402


@pytest.mark.parametrize("ranks", [2, 3])
def test_autotune_and_timeline_from_environment(ranks, tmp_path):
    log_path = tmp_path / "autotune.csv"
    timeline_path = tmp_path / "timeline.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               TFRING_AUTOTUNE="1", TFRING_AUTOTUNE_LOG=str(log_path),
               TFRING_AUTOTUNE_WARMUP_SAMPLES="1",
               TFRING_AUTOTUNE_CYCLES_PER_SAMPLE="3",
               TFRING_AUTOTUNE_SAMPLES_PER_TRIAL="2",
               TFRING_AUTOTUNE_MAX_TRIALS=str(MAX_TRIALS),
               # Set by the user: the tuner must leave it alone, even though
               # TFRING_AUTOTUNE_START names it.
               TFRING_CYCLE_TIME="2",
               TFRING_AUTOTUNE_START="fusion_threshold=65536,cycle_time=7",
               TFRING_TIMELINE=str(timeline_path))
    # Not set, so tuned, within the buffer its default reserved.
    env.pop("TFRING_FUSION_THRESHOLD", None)
    result = mpi_launch.launch([sys.executable, str(SCRIPT), str(STEPS)], ranks,
                               JOB_TIMEOUT_S, env=env, cwd=str(ROOT))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    for rank in range(ranks):
        assert f"rank {rank} STEPS_OK" in result.output, result.describe()

    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["trial", "phase", "fusion_threshold", "direct_threshold",
                             "cycle_time_ms", "score_bytes_per_s", "samples"]
    trials, final = rows[:-1], rows[-1]
    assert [int(r["trial"]) for r in trials] == list(range(1, MAX_TRIALS + 1)), rows
    assert {r["phase"] for r in trials} <= {"initial", "bayes"}, rows
    assert final["phase"] == "final", rows
    # The start came from TFRING_AUTOTUNE_START, except the fixed cycle time.
    assert int(trials[0]["fusion_threshold"]) == 65536, rows
    assert all(float(r["cycle_time_ms"]) == 2.0 for r in rows), rows
    assert len({r["fusion_threshold"] for r in trials}) > 1, rows
    assert all(int(r["fusion_threshold"]) <= DEFAULT_FUSION_THRESHOLD for r in rows), rows
    assert all(float(r["score_bytes_per_s"]) > 0 for r in rows), rows
    chosen = {k: final[k] for k in ("fusion_threshold", "direct_threshold", "cycle_time_ms")}
    assert chosen in [{k: r[k] for k in chosen} for r in trials], rows

    with open(timeline_path) as f:
        trace = json.load(f)  # valid JSON: closed at exit
    assert trace["otherData"]["size"] == ranks
    summary = timeline_tool.summarize(timeline_tool.load(str(timeline_path)))
    assert summary["ops"]["allreduce"]["tensors"] == STEPS * TENSORS_PER_STEP
    assert summary["ops"]["allreduce"]["errors"] == 0
    marks = [e for e in trace["traceEvents"] if e.get("name") == "ready"]
    assert {m["args"]["rank"] for m in marks} == set(range(ranks))


@pytest.mark.parametrize("variable", ["TFRING_TIMELINE", "HOROVOD_TIMELINE"])
def test_timeline_never_writes_through_a_symbolic_link(variable, tmp_path):
    # A link planted where the timeline goes (as another user can in /tmp)
    # must not make the job overwrite the link's target: init warns naming
    # the path and the variable and runs without a timeline,
    # start_timeline() raises naming the path, and a new file is the user's
    # alone (0600).
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    env_link, call_link = tmp_path / "env_timeline.json", tmp_path / "call_timeline.json"
    env_link.symlink_to(target)
    call_link.symlink_to(target)
    fresh = tmp_path / "fresh.json"
    env = mpi_launch.working_tree_env(**{variable: str(env_link)})
    for name in ("TFRING_TIMELINE", "HOROVOD_TIMELINE"):
        if name != variable:
            env.pop(name, None)
    result = mpi_launch.launch(
        [sys.executable, str(ROOT / "tests" / "job_scripts" / "timeline_paths_job.py"),
         str(call_link), str(fresh)], 1, JOB_TIMEOUT_S, env=env, cwd=str(ROOT))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    assert target.read_text() == "keep me\n", result.describe()
    assert (f"tfring timeline ({variable}): '{env_link}' is a symbolic link, and tfring "
            "does not write through one") in result.output, result.describe()
    assert "Running without a timeline." in result.output, result.describe()
    assert (f"REFUSED tfring timeline (tfring.start_timeline()): '{call_link}' is a "
            "symbolic link") in result.output, result.describe()
    assert "MODE 600" in result.output, result.describe()
