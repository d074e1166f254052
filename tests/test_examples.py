# Runs each example in keras_examples/ for a few steps at 2 ranks, as CI
# does, so an API change that breaks them shows up here.

import pathlib
import sys

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "keras_examples"
TIMEOUT_SECONDS = 300


def test_synthetic_benchmark_at_two_ranks():
    script = EXAMPLES / "tensorflow2_synthetic_benchmark.py"
    argv = [sys.executable, str(script),
            "--steps", "3", "--warmup-steps", "2", "--batch-size", "16",
            "--intra-op-threads", "1"]
    result = mpi_launch.launch(
        argv, 2, TIMEOUT_SECONDS,
        env=mpi_launch.working_tree_env(quiet_tensorflow=True), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    assert "Total img/sec on 2 ranks:" in result.output, result.describe()
    assert "Rank 1:" in result.output, result.describe()


def test_keras_digits_at_two_ranks(tmp_path):
    # A few steps of the real-data example: fit with DistributedOptimizer,
    # warm-up, broadcast, metric averaging and rank-0 checkpointing.
    script = EXAMPLES / "keras_digits.py"
    argv = [sys.executable, str(script), "--epochs", "3", "--steps", "20",
            "--checkpoint-dir", str(tmp_path)]
    result = mpi_launch.launch(
        argv, 2, TIMEOUT_SECONDS,
        env=mpi_launch.working_tree_env(quiet_tensorflow=True), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    lines = [line for line in result.output.splitlines()
             if line.startswith("Final validation accuracy:")]
    # Printed by rank 0 only.
    assert len(lines) == 1, result.describe()
    accuracy = float(lines[0].split(":")[1])
    # 60 steps of batch 2 x 32 reach 0.87-0.92 (seeds 0-3); chance is 0.1.
    assert 0.6 < accuracy <= 1.0, result.describe()
    assert (tmp_path / "best.keras").is_file(), result.describe()
    assert "Trained 3 epochs x 20 steps on 2 ranks" in result.output, (
        result.describe())


def test_keras_synthetic_benchmark_at_two_ranks():
    script = EXAMPLES / "keras_synthetic_benchmark.py"
    argv = [sys.executable, str(script), "--epochs", "2", "--steps", "4",
            "--warmup-steps", "3", "--batch-size", "16",
            "--intra-op-threads", "1"]
    result = mpi_launch.launch(
        argv, 2, TIMEOUT_SECONDS,
        env=mpi_launch.working_tree_env(quiet_tensorflow=True), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    assert "5 timed steps after 3 warm-up steps" in result.output, (
        result.describe())
    assert "Rank 1:" in result.output, result.describe()
    assert "Total img/sec on 2 ranks:" in result.output, result.describe()


def test_torch_digits_at_two_ranks():
    # tfring.torch's example: DistributedOptimizer, broadcasts, allreduce.
    import pytest
    pytest.importorskip("torch")
    script = REPO / "torch_examples" / "digits.py"
    argv = [sys.executable, str(script), "--epochs", "6", "--steps", "20"]
    result = mpi_launch.launch(
        argv, 2, TIMEOUT_SECONDS,
        env=mpi_launch.working_tree_env(quiet_tensorflow=True), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    lines = [line for line in result.output.splitlines()
             if line.startswith("Final validation accuracy:")]
    assert len(lines) == 1, result.describe()  # rank 0 only
    # Chance is 0.1; 120 steps of batch 2 x 32 reach 0.85-0.95.
    assert 0.5 < float(lines[0].split(":")[1]) <= 1.0, result.describe()
    assert "Trained 6 epochs x 20 steps on 2 ranks" in result.output
