# Tests of tfringrun (tfring/runner.py): the mpirun command line is built by
# pure functions, tested here without MPI; one real 2-rank launch checks that
# the command it execs actually starts a job.

import os
import signal
import subprocess
import sys

import pytest

from tfring import runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(argv, environ=None, euid=1000, cpu_count=8):
    args = runner.parse_args(argv)
    return runner.mpirun_command(args, "/opt/mpi/bin/mpirun", environ or {},
                                 euid, cpu_count)


def test_plain_command():
    assert command(["-np", "2", "python", "train.py", "--steps", "3"]) == [
        "/opt/mpi/bin/mpirun", "-np", "2", "--bind-to", "none",
        "python", "train.py", "--steps", "3"]


def test_options_after_the_program_belong_to_the_program():
    cmd = command(["-np", "2", "python", "t.py", "-np", "5", "--verbose"])
    assert cmd[-5:] == ["python", "t.py", "-np", "5", "--verbose"]
    assert cmd[1:3] == ["-np", "2"]


def test_double_dash_separates_the_program():
    assert command(["--verbose", "-np", "2", "--", "--odd-program"])[-1] == \
        "--odd-program"


def test_root_adds_allow_run_as_root():
    assert "--allow-run-as-root" in command(["-np", "2", "p"], euid=0)
    assert "--allow-run-as-root" not in command(["-np", "2", "p"], euid=1000)


@pytest.mark.parametrize("argv, cpus, expected", [
    (["-np", "4", "p"], 2, True),
    (["-np", "2", "p"], 2, False),
    (["-np", "4", "-H", "localhost:4", "p"], 2, True),
    (["-np", "4", "-H", "a:2,b:2", "p"], 2, False),
    (["-np", "4", "--hostfile", "hosts", "p"], 2, False),
    (["-np", "2", "p"], None, True),
])
def test_oversubscribe_only_past_the_cores_of_a_single_host(argv, cpus,
                                                            expected):
    assert ("--oversubscribe" in command(argv, cpu_count=cpus)) == expected


def test_hosts_and_hostfile_are_passed_on():
    cmd = command(["-np", "4", "-H", "a:2,b:2", "p"])
    assert cmd[cmd.index("-H") + 1] == "a:2,b:2"
    cmd = command(["-np", "4", "--hostfile", "/etc/hosts.mpi", "p"])
    assert cmd[cmd.index("--hostfile") + 1] == "/etc/hosts.mpi"


def test_forwards_tfring_variables_and_pythonpath_only():
    environ = {"TFRING_CYCLE_TIME": "2", "TFRING_FUSION_THRESHOLD": "0",
               "PYTHONPATH": "/src", "HOME": "/root",
               "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = command(["-np", "2", "p"], environ=environ)
    forwarded = [cmd[i + 1] for i, word in enumerate(cmd) if word == "-x"]
    assert forwarded == ["PYTHONPATH", "TFRING_CYCLE_TIME",
                         "TFRING_FUSION_THRESHOLD"]
    assert cmd[-1] == "p"


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_bad_num_proc_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as e:
        runner.parse_args(["-np", value, "p"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"got '{value}'" in err
    assert "positive whole number of processes" in err


def test_missing_num_proc_or_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["python", "t.py"])
    assert "-np" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.parse_args(["-np", "2"])
    assert "no command given" in capsys.readouterr().err


def _executable(path):
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(path, 0o755)
    return str(path)


def test_find_mpirun_order(tmp_path):
    venv_bin = tmp_path / "venv" / "bin"
    path_bin = tmp_path / "path"
    venv_bin.mkdir(parents=True)
    path_bin.mkdir()
    python = str(venv_bin / "python")
    on_path = _executable(path_bin / "mpirun")
    environ = {"PATH": str(path_bin)}
    assert runner.find_mpirun(environ, python) == on_path
    beside = _executable(venv_bin / "mpirun")
    assert runner.find_mpirun(environ, python) == beside
    chosen = _executable(tmp_path / "my-mpirun")
    environ["TFRING_MPIRUN"] = chosen
    assert runner.find_mpirun(environ, python) == chosen


def test_missing_mpirun_says_how_to_fix(tmp_path):
    python = str(tmp_path / "python")
    with pytest.raises(runner.RunnerError,
                       match="TFRING_MPIRUN=/path/to/mpirun"):
        runner.find_mpirun({"PATH": str(tmp_path)}, python)
    with pytest.raises(runner.RunnerError, match="'/no/such/mpirun'.*not an"):
        runner.find_mpirun({"TFRING_MPIRUN": "/no/such/mpirun"}, python)


def _run(argv, env, timeout=120):
    """Runs argv in its own process group; kills the group on timeout."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} ran past {timeout} s\nstdout:\n{out}\n"
                    f"stderr:\n{err}")
    return proc.returncode, out, err


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


def test_missing_mpirun_exits_with_the_message(tmp_path):
    rc, _, err = _run([sys.executable, "-m", "tfring.runner", "-np", "2",
                       "true"], _env(TFRING_MPIRUN=str(tmp_path / "nope")))
    assert rc == 127
    assert "tfringrun: error: TFRING_MPIRUN is set to" in err


def test_real_two_rank_run():
    pytest.importorskip("mpi4py")
    script = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
              "print(f'rank {c.Get_rank()} of {c.Get_size()}', flush=True)")
    rc, out, err = _run(
        [sys.executable, "-m", "tfring.runner", "--verbose", "-np", "2",
         sys.executable, "-c", script], _env(TFRING_TEST_MARK="1"))
    assert rc == 0, err
    ranks = sorted(line for line in out.splitlines()
                   if line.startswith("rank "))
    assert ranks == ["rank 0 of 2", "rank 1 of 2"]
    assert "-x TFRING_TEST_MARK" in err  # the --verbose echo of the command


def test_exit_status_passes_through():
    rc, _, _ = _run([sys.executable, "-m", "tfring.runner", "-np", "2",
                     sys.executable, "-c", "raise SystemExit(3)"], _env())
    assert rc == 3
