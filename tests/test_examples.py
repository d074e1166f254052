# Runs each example in keras_examples/ and torch_examples/ for a few steps
# at 2 ranks (and at 3 where uneven shares matter), as CI does, so an API
# change that breaks them shows up here.

import pathlib
import sys

import pytest

import mpi_launch

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "keras_examples"
TIMEOUT_SECONDS = 300
# The digits example trains in about 12 s at 3 ranks; a stalled run would
# warn every 60 s until the 30-minute stall limit.
TORCH_DIGITS_TIMEOUT_SECONDS = 150


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


@pytest.mark.parametrize("num_ranks, steps", [
    (2, "22, 22"),
    # 1438 training images: 480 on rank 0 and 479 on the others, so rank 0
    # runs 15 steps of 32 per epoch and the others 14.
    (3, "15, 14, 14"),
])
def test_torch_digits_one_pass_per_epoch(num_ranks, steps):
    # Without --steps each rank makes one pass over its share: at 3 ranks
    # the shares give different step counts, and the ranks that finish
    # first wait in hvd.join() (without it the job stalls until the
    # timeout).
    pytest.importorskip("torch")
    script = REPO / "torch_examples" / "digits.py"
    argv = [sys.executable, str(script), "--epochs", "6"]
    result = mpi_launch.launch(
        argv, num_ranks, TORCH_DIGITS_TIMEOUT_SECONDS,
        env=mpi_launch.working_tree_env(quiet_tensorflow=True), cwd=str(REPO))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    lines = [line for line in result.output.splitlines()
             if line.startswith("Final validation accuracy:")]
    assert len(lines) == 1, result.describe()
    # Chance is 0.1; seeds 0-2 reach 0.85-0.95 at 3 ranks.
    assert 0.6 < float(lines[0].split(":")[1]) <= 1.0, result.describe()
    assert (f"on {num_ranks} ranks (steps per epoch, rank by rank: "
            f"{steps})") in result.output, result.describe()


def test_torch_modern_example_trains_and_resumes_at_two_ranks(tmp_path):
    # torch_examples/train_modern.py: DistributedSampler, bf16 autocast,
    # clipping after synchronize(), OneCycleLR, uneven shares (3841 samples:
    # 31 and 30 batches of 64) with hvd.join(), a checkpoint and resuming.
    pytest.importorskip("torch")
    checkpoint = str(tmp_path / "checkpoint.pt")
    env = mpi_launch.working_tree_env(quiet_tensorflow=True)
    first = mpi_launch.launch(
        [sys.executable, str(REPO / "torch_examples" / "train_modern.py"),
         "--epochs", "4", "--stop-after", "2", "--checkpoint", checkpoint],
        2, TIMEOUT_SECONDS, env=env, cwd=str(REPO))
    assert first.returncode == 0 and not first.timed_out, first.describe()
    assert "epoch 2/4: " in first.output, first.describe()
    assert "epoch 3/4: " not in first.output, first.describe()
    assert "steps per rank [31, 30]" in first.output, first.describe()
    assert "Stopped after epoch 2 of 4" in first.output, first.describe()

    # The job script checks on every rank that the example's resume()
    # restores the checkpoint exactly, then runs the example's main() to
    # epoch 4 and checks that every rank ends with the same weights.
    second = mpi_launch.launch(
        [sys.executable,
         str(REPO / "tests" / "job_scripts" / "modern_example_resume.py"),
         checkpoint, "4"],
        2, TIMEOUT_SECONDS, env=env, cwd=str(REPO))
    assert second.returncode == 0 and not second.timed_out, second.describe()
    for rank in (0, 1):
        assert f"rank {rank} RESUMED_OK at epoch 2" in second.output, (
            second.describe())
        assert f"rank {rank} SAME_WEIGHTS_OK" in second.output, (
            second.describe())
    assert f"resumed from {checkpoint} after epoch 2" in second.output
    assert "epoch 2/4: " not in second.output, second.describe()
    assert "epoch 4/4: " in second.output, second.describe()
    lines = [line for line in second.output.splitlines()
             if line.startswith("Final validation accuracy:")]
    assert len(lines) == 1, second.describe()
    # Chance is 0.1; 4 epochs reach 0.87-0.89 (seed 0 at 2 and 3 ranks).
    assert 0.75 < float(lines[0].split(":")[1]) <= 1.0, second.describe()


def test_mxnet_gluon_example_at_two_ranks(tmp_path, monkeypatch):
    # tfring.mxnet's example, with the MXNet environment's Python.
    import mxnet_env
    if not mxnet_env.available():
        pytest.skip(mxnet_env.MISSING_REASON)
    overlay = mxnet_env.make_overlay(tmp_path)
    env = mxnet_env.rank_env(overlay, monkeypatch)
    argv = [str(mxnet_env.PYTHON), str(REPO / "mxnet_examples" / "gluon_blobs.py"),
            "--epochs", "3"]
    result = mpi_launch.launch(argv, 2, TIMEOUT_SECONDS, env=env, cwd=str(overlay))
    assert result.returncode == 0 and not result.timed_out, result.describe()
    lines = [line for line in result.output.splitlines()
             if line.startswith("Final validation accuracy:")]
    assert len(lines) == 1, result.describe()  # rank 0 only
    # Chance is 0.1; the clusters are well apart.
    assert 0.8 < float(lines[0].split(":")[1]) <= 1.0, result.describe()
    assert "Trained 3 epochs on 2 ranks" in result.output, result.describe()
