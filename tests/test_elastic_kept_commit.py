"""The commits each host keeps on disk for a job tfringrun starts again after
losing a host (tfring/elastic/kept_commit.py, the states' snapshots, and
tfringrun's --elastic-commit-dir), without MPI. The restart itself, a host's
PRRTE daemon killed mid-step, is tests/test_elastic_multihost.py's."""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tfring.elastic import kept_commit
from tfring.elastic.state import ObjectState
from tfring.launcher import cli as runner
from tfring.launcher import command as launch_command_line

import mpi_launch


def _snapshot():
    return {"attributes": {"epoch": 3, "name": "resnet"},
            "variables": [np.arange(100000, dtype=np.float32),
                          np.full((3, 4), 2.5), np.array(7, np.int64),
                          np.arange(12.0).reshape(3, 4).T]}  # not contiguous


def test_a_kept_commit_reads_back_the_same(tmp_path):
    kept = kept_commit.KeptCommits(str(tmp_path / "commits"), host="hostA")
    kept.keep(5, _snapshot())
    assert kept.wait(timeout=60)
    assert kept.path == str(tmp_path / "commits" / "hostA.commit")
    number, snapshot = kept_commit.KeptCommits(
        str(tmp_path / "commits"), host="hostA").read()
    assert number == 5
    assert snapshot["attributes"] == {"epoch": 3, "name": "resnet"}
    for got, want in zip(snapshot["variables"], _snapshot()["variables"]):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and got.shape == want.shape
    # Assignable to variables, and changeable: a writable array.
    snapshot["variables"][0][0] = 1.0


def test_the_newest_commit_is_the_one_kept(tmp_path):
    kept = kept_commit.KeptCommits(str(tmp_path), host="h")
    for number in range(1, 41):
        kept.keep(number, {"attributes": {"step": number},
                           "variables": [np.full(50000, number, np.float64)]})
    assert kept.wait(timeout=60)
    number, snapshot = kept.read()
    assert number == 40 and snapshot["attributes"]["step"] == 40
    assert snapshot["variables"][0][0] == 40.0
    assert os.listdir(tmp_path) == ["h.commit"]


def test_commits_taken_while_the_writer_rests_wait_and_the_newest_goes(
        tmp_path):
    kept = kept_commit.KeptCommits(str(tmp_path), host="h")
    kept.keep(1, _snapshot())
    assert kept.wait(timeout=60)
    # As if the last write had taken 3 s / 19: the writer rests 3 s.
    kept._not_before = time.monotonic() + 3.0
    kept.keep(2, {"attributes": {"step": 2}})
    kept.keep(3, {"attributes": {"step": 3}})
    assert kept.read()[0] == 1
    assert not kept.wait(timeout=0.1)
    assert kept.wait(timeout=60)
    assert kept.read() == (3, {"attributes": {"step": 3}})


def test_a_write_cut_short_leaves_the_last_commit_whole(tmp_path):
    kept = kept_commit.KeptCommits(str(tmp_path), host="h")
    kept.keep(1, _snapshot())
    assert kept.wait(timeout=60)
    # What a rank killed mid-write leaves: half a temporary file.
    whole = open(kept.path, "rb").read()
    with open(f"{kept.path}.4242.writing", "wb") as f:
        f.write(whole[:len(whole) // 2])
    assert kept.read()[0] == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_unreadable_commit_is_none_with_a_warning(tmp_path, capsys,
                                                      damage):
    kept = kept_commit.KeptCommits(str(tmp_path), host="h")
    if damage == "garbage":
        open(kept.path, "wb").write(b"not a commit at all")
    else:
        kept.keep(1, _snapshot())
        assert kept.wait(timeout=60)
        whole = open(kept.path, "rb").read()
        open(kept.path, "wb").write(whole[:-10])
    assert kept.read() is None
    said = capsys.readouterr().err
    assert f"could not read the commit kept in {kept.path}" in said, said
    assert "resumes from an older commit, or from the program's start" in said
    assert "--elastic-commit-dir none" in said


def test_a_directory_that_cannot_be_written_is_a_warning_not_a_crash(
        tmp_path, capsys):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    kept = kept_commit.KeptCommits(str(blocker / "commits"), host="h")
    for number in (1, 2):
        kept.keep(number, _snapshot())
        assert kept.wait(timeout=60)
    said = capsys.readouterr().err
    assert said.count("tfring elastic: could not write commit") == 1, said
    assert "Point --elastic-commit-dir at a writable local directory" in said
    assert kept.read() is None


def test_remove_deletes_the_file_and_the_emptied_directory(tmp_path):
    directory = tmp_path / "commits"
    first = kept_commit.KeptCommits(str(directory), host="hostA")
    second = kept_commit.KeptCommits(str(directory), host="hostB")
    for kept in (first, second):
        kept.keep(1, _snapshot())
        assert kept.wait(timeout=60)
    first.remove()
    assert os.listdir(directory) == ["hostB.commit"]
    second.remove()
    assert not directory.exists()


def test_commits_are_kept_only_in_an_elastic_job_with_a_directory(
        monkeypatch, tmp_path):
    monkeypatch.delenv("TFRING_ELASTIC", raising=False)
    monkeypatch.setenv("TFRING_ELASTIC_COMMIT_DIR", str(tmp_path))
    assert kept_commit.for_this_job() is None
    monkeypatch.setenv("TFRING_ELASTIC", "1")
    assert kept_commit.for_this_job().directory == str(tmp_path)
    monkeypatch.setenv("TFRING_ELASTIC_COMMIT_DIR", "")
    assert kept_commit.for_this_job() is None


def _through_a_file(state, fresh, tmp_path):
    """fresh's saved state after state's last commit went through a file."""
    kept = kept_commit.KeptCommits(str(tmp_path), host="h")
    kept.keep(state._commits, state._snapshot())
    assert kept.wait(timeout=60)
    number, snapshot = kept.read()
    fresh._load_snapshot(snapshot)
    fresh.restore()
    return number


def test_an_object_state_resumes_from_its_kept_commit(tmp_path):
    state = ObjectState(epoch=0, batch=0)
    state.epoch, state.batch = 4, 17
    state.commit()
    state.batch = 99  # after the commit: not kept
    fresh = ObjectState(epoch=0, batch=0)
    assert _through_a_file(state, fresh, tmp_path) == 1
    assert (fresh.epoch, fresh.batch) == (4, 17)


def test_a_keras_state_resumes_its_model_and_optimizer(tmp_path):
    import keras
    import tensorflow as tf
    from tfring.keras.elastic import KerasState

    def model_and_optimizer():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        return model, keras.optimizers.SGD(0.1, momentum=0.9)

    model, optimizer = model_and_optimizer()
    state = KerasState(model, optimizer, epoch=0)
    data = tf.constant([[1.0, 2.0, 3.0]])
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(data) ** 2)
        optimizer.apply_gradients(zip(
            tape.gradient(loss, model.trainable_variables),
            model.trainable_variables))
    state.epoch = 2
    state.commit()
    committed = [v.numpy().copy() for v in model.variables + list(
        optimizer.variables)]
    fresh_model, fresh_optimizer = model_and_optimizer()
    fresh = KerasState(fresh_model, fresh_optimizer, epoch=0)
    _through_a_file(state, fresh, tmp_path)
    assert fresh.epoch == 2
    restored = [v.numpy() for v in fresh_model.variables + list(
        fresh_optimizer.variables)]
    assert len(restored) == len(committed)
    for got, want in zip(restored, committed):
        np.testing.assert_array_equal(got, want)
    # The momentum is part of it: not the fresh optimizer's zeros.
    assert any(np.any(v != 0) for v in committed[len(model.variables):])


def test_a_torch_state_resumes_its_model_and_optimizer(tmp_path):
    import torch
    from tfring.torch.elastic import TorchState

    def model_and_optimizer():
        torch.manual_seed(1)
        model = torch.nn.Linear(3, 2)
        return model, torch.optim.SGD(model.parameters(), lr=0.1,
                                      momentum=0.9)

    model, optimizer = model_and_optimizer()
    state = TorchState(model, optimizer, epoch=0)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(1, 3)).pow(2).sum().backward()
        optimizer.step()
    state.epoch = 2
    state.commit()
    fresh_model, fresh_optimizer = model_and_optimizer()
    fresh = TorchState(fresh_model, fresh_optimizer, epoch=0)
    _through_a_file(state, fresh, tmp_path)
    assert fresh.epoch == 2
    for got, want in zip(fresh_model.parameters(), model.parameters()):
        assert torch.equal(got, want)
    momentum = [s["momentum_buffer"] for s in
                fresh_optimizer.state_dict()["state"].values()]
    assert momentum and all(torch.equal(a, s["momentum_buffer"]) for a, s in
                            zip(momentum,
                                optimizer.state_dict()["state"].values()))


def _command(argv, environ=None):
    args = runner.parse_args(argv)
    return launch_command_line.mpirun_command(
        args, "/usr/bin/mpirun", environ or {}, 1000, 8, None)


def _value(command, name):
    values = [option.split("=", 1)[1] for option in command
              if option.startswith(f"{name}=")]
    assert len(values) == 1, command
    return values[0]


def test_tfringrun_names_a_new_directory_of_kept_commits_per_job(
        monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("TFRING_ELASTIC_COMMIT_DIR", raising=False)
    argv = ["-np", "2", "--min-np", "1", "python", "train.py"]
    first = _value(_command(argv), "TFRING_ELASTIC_COMMIT_DIR")
    second = _value(_command(argv), "TFRING_ELASTIC_COMMIT_DIR")
    assert os.path.dirname(first) == str(tmp_path), first
    assert os.path.basename(first).startswith(f"tfring-elastic-{os.getpid()}-")
    assert first != second
    chosen = _value(_command(["--elastic-commit-dir", "kept", *argv]),
                    "TFRING_ELASTIC_COMMIT_DIR")
    assert chosen == os.path.abspath("kept")
    assert _value(_command(["--elastic-commit-dir", "none", *argv]),
                  "TFRING_ELASTIC_COMMIT_DIR") == ""
    monkeypatch.setenv("TFRING_ELASTIC_COMMIT_DIR", "/data/kept")
    assert _value(_command(argv), "TFRING_ELASTIC_COMMIT_DIR") == "/data/kept"
    assert "TFRING_ELASTIC_COMMIT_DIR" not in " ".join(
        _command(["-np", "2", "python", "train.py"]))


def _fake_mpirun(tmp_path, body):
    path = tmp_path / "mpirun"
    path.write_text(f"#!{sys.executable}\nimport os, sys\n{body}\n")
    path.chmod(0o755)
    return path


# The fake mpirun writes a commit file where tfringrun told the ranks to,
# as a rank would, and exits with status 3.
_WRITES_A_COMMIT = """
directory = [a.split("=", 1)[1] for a in sys.argv
             if a.startswith("TFRING_ELASTIC_COMMIT_DIR=")][0]
os.makedirs(directory)
open(os.path.join(directory, "hostA.commit"), "wb").write(b"kept")
print(directory)
sys.exit(3)
"""


@pytest.mark.parametrize("chosen", [False, True])
def test_tfringrun_removes_only_the_directory_it_named(tmp_path, chosen):
    env = mpi_launch.working_tree_env(
        TFRING_MPIRUN=str(_fake_mpirun(tmp_path, _WRITES_A_COMMIT)),
        TMPDIR=str(tmp_path))
    env.pop("TFRING_ELASTIC_COMMIT_DIR", None)
    options = ["--elastic-commit-dir", str(tmp_path / "mine")] if chosen else []
    done = subprocess.run(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2", "--min-np",
         "1", *options, "true"], env=env, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 3, done.stderr
    directory = done.stdout.strip()
    if chosen:
        assert directory == str(tmp_path / "mine")
        assert os.listdir(directory) == ["hostA.commit"]
    else:
        assert directory.startswith(str(tmp_path / "tfring-elastic-"))
        assert not os.path.exists(directory)


class _OneRankComm:
    """A communicator of one rank, as mpi4py's object collectives see it."""

    def __init__(self):
        self.calls = []

    def Get_rank(self):
        return 0

    def allgather(self, value):
        self.calls.append("allgather")
        return [value]

    def bcast(self, value, root):
        self.calls.append(f"bcast from {root}")
        return value


def _restarted_job(monkeypatch, tmp_path, resets):
    from tfring.elastic import runner, settings
    monkeypatch.setenv("TFRING_ELASTIC", "1")
    monkeypatch.setenv("TFRING_ELASTIC_RESTARTS", "1")
    monkeypatch.setenv("TFRING_ELASTIC_COMMIT_DIR", str(tmp_path))
    kept = kept_commit.for_this_job()
    kept.keep(3, {"attributes": {"step": 30}})
    assert kept.wait(timeout=60)
    members = type("Members", (), {"comm": _OneRankComm(), "resets": resets})()
    state = ObjectState(step=0)
    runner._resume_from_kept_commit(state, members,
                                    settings.from_environment())
    return state, members.comm.calls


def test_a_restarted_job_resumes_from_the_newest_kept_commit(
        monkeypatch, tmp_path, capsys):
    state, calls = _restarted_job(monkeypatch, tmp_path, resets=0)
    assert (state.step, state._commits) == (30, 3)
    assert calls == ["allgather", "bcast from 0"]
    assert ("tfring elastic: resuming from commit 3, kept on host "
            in capsys.readouterr().err)


def test_a_rank_started_into_a_restarted_job_waits_for_the_sync(
        monkeypatch, tmp_path):
    # Its peers are training, not resuming: a collective here would hang.
    state, calls = _restarted_job(monkeypatch, tmp_path, resets=1)
    assert (state.step, calls) == (0, [])
