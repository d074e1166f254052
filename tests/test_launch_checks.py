# Tests of `tfringrun --check-build` and `--check-hosts`
# (tfring/launcher/checks.py, tfring/launcher/probes.py).
#
# The decisions (which host differs, what a job's reports mean, which MPI a
# version text names) are pure functions, tested on made-up inputs,
# including every failure the checks explain. Real runs: --check-build here
# (a real 2-rank allreduce), --check-hosts with localhost and this machine's
# hostname, with a host name that does not resolve (it must fail fast and
# name it), and with a fake mpirun that hangs (the check must end at its
# time limit and leave no process behind).

import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tfring.launcher import checks as launch_checks
from tfring.launcher import probes as launch_probes
from tfring.launcher import cli as runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = os.path.join(sys.prefix, "bin", "mpirun")


def _facts(mpirun=MPIRUN):
    return (mpirun, os.environ, os.geteuid(), os.cpu_count())


@pytest.fixture(autouse=True)
def _ranks_import_this_tree(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


# --- which MPI a version text names ------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("mpirun (Open MPI) 5.0.11\n\nReport bugs to ...", ("Open MPI", "5.0.11")),
    ("Open MPI v5.0.11, package: Open MPI conda@host Distribution, ident: "
     "5.0.11, repo rev: v5.0.11", ("Open MPI", "5.0.11")),
    ("MPICH Version:      4.2.1\nMPICH Release date: ...", ("MPICH", "4.2.1")),
    ("HYDRA build details:\n    Version:    4.2.1\n", ("MPICH", "4.2.1")),
    ("Intel(R) MPI Library 2021.10", None),
])
def test_mpi_implementation(text, expected):
    assert launch_checks.mpi_implementation(text) == expected


def test_launcher_and_library_from_different_mpis_are_named():
    assert launch_checks.launcher_library_mismatch(
        "mpirun (Open MPI) 5.0.11", "Open MPI v5.0.11, package", "m") is None
    assert launch_checks.launcher_library_mismatch(
        "something else", "Open MPI v5.0.11", "m") is None
    message = launch_checks.launcher_library_mismatch(
        "HYDRA build details:\n Version: 4.1.2", "Open MPI v5.0.11",
        "/usr/bin/mpirun")
    assert message == (
        "/usr/bin/mpirun is MPICH 4.1.2, but mpi4py loads Open MPI 5.0.11. "
        "Expected mpirun from the same MPI installation as the library, or "
        "the ranks cannot find each other. Point TFRING_MPIRUN at that "
        "installation's mpirun, or reinstall mpi4py against this mpirun's "
        "MPI.")


# --- what the 2-rank job's reports mean --------------------------------------

def _rank_report(rank, size=2, **changes):
    floats, ints = launch_probes.expected_sums(size)
    report = {"hostname": "node1", "launch_rank": rank, "error": None,
              "mpi_library": "Open MPI v5.0.11, package: Open MPI",
              "mpi4py": "4.1.2", "thread_level": "MPI_THREAD_MULTIPLE",
              "rank": rank, "size": size, "local_size": size, "shm": True,
              "nccl": 0, "config": {"TFRING_SHM": "1"},
              "float_sum": floats, "int_sum": ints}
    report.update(changes)
    return report


def _result(reports, returncode=0, noise=()):
    lines = list(noise) + [launch_probes.REPORT_MARK + json.dumps(r)
                           for r in reports]
    return launch_checks.JobResult(["mpirun"], returncode, "\n".join(lines),
                                   4.2)


def _findings(result):
    return launch_checks.job_findings(result, 60, "mpirun (Open MPI) 5.0.11",
                                      "/venv/bin/mpirun")


def _lines(findings):
    return [f.line() for f in findings]


def test_a_working_job_reports_mpi_nccl_shm_and_the_sums():
    findings = _findings(_result([_rank_report(1), _rank_report(0)]))
    assert not [f for f in findings if f.problem]
    assert _lines(findings) == [
        "  MPI library       Open MPI v5.0.11 (mpi4py 4.1.2); thread level "
        "MPI_THREAD_MULTIPLE",
        "  NCCL              no (tfring was built without NCCL)",
        "  shared memory     yes (2 ranks on one host)",
        "  2-rank allreduce  ok: Sum gave float32 [3.0, 30.0] and int32 "
        "[3, -3] on both ranks (4.2 s)"]


@pytest.mark.parametrize("changes, noise, reason", [
    ({"config": {"TFRING_SHM": "0"}}, (),
     "no: TFRING_SHM=0 (or --no-shm) turns it off; the ranks use MPI"),
    ({}, ["[tfring W] shared memory is not used, the ranks on this host talk "
          "through MPI (slower): no room in /dev/shm"],
     "no: [tfring W] shared memory is not used, the ranks on this host talk "
     "through MPI (slower): no room in /dev/shm; the ranks use MPI"),
    ({}, (), "no: rank 0 gave no reason; run with --log-level debug; the "
             "ranks use MPI"),
])
def test_shared_memory_off_says_why(changes, noise, reason):
    reports = [_rank_report(r, shm=False, **changes) for r in range(2)]
    findings = _findings(_result(reports, noise=noise))
    assert f"  shared memory     {reason}" in _lines(findings)
    assert not [f for f in findings if f.problem]


def test_a_wrong_sum_fails_the_check():
    reports = [_rank_report(0), _rank_report(1, int_sum=[3, 3])]
    problems = [f for f in _findings(_result(reports)) if f.problem]
    assert [f.label for f in problems] == ["2-rank allreduce"]
    assert problems[0].problem.startswith(
        "rank 1 got float32 [3.0, 30.0] and int32 [3, 3] from Sum "
        "allreduces. Expected [3.0, 30.0] and [3, -3].")


def test_ranks_that_did_not_meet_blame_the_mpirun():
    # What a mpirun of another MPI does: two singletons.
    reports = [_rank_report(0, size=1, mpi_library="MPICH Version: 4.2.1"),
               _rank_report(0, size=1, mpi_library="MPICH Version: 4.2.1")]
    [finding] = _findings(_result(reports))
    assert finding.text == "the ranks did not meet"
    assert finding.problem.startswith(
        "mpirun started 2 processes, but tfring.size() was 1 and 1: each "
        "process ran as an MPI job of its own. Expected one job of size 2.")
    assert ("/venv/bin/mpirun is Open MPI 5.0.11, but mpi4py loads MPICH "
            "4.2.1.") in finding.problem


def test_a_failed_rank_is_quoted():
    reports = [_rank_report(0), {"hostname": "node1", "launch_rank": 1,
                                 "error": "ValueError: bad", "traceback": ""}]
    [finding] = _findings(_result(reports, returncode=1))
    assert finding.problem.startswith(
        "rank 1 of the 2-rank check job on node1 failed: ValueError: bad. "
        "Expected tfring.init() and two allreduces to succeed.")


@pytest.mark.parametrize("returncode, ending", [
    (None, "ran past the 60 s limit"), (1, "exited with status 1")])
def test_a_job_that_does_not_finish_says_how(returncode, ending):
    result = _result([_rank_report(0)], returncode,
                     noise=["prterun: something went wrong"])
    [finding] = _findings(result)
    assert finding.problem.startswith(
        f"the 2-rank check job {ending} after 4.2 s with 1 of 2 reports. "
        f"Expected both ranks to start tfring, allreduce and exit within "
        f"60 s. If the machine is only slow, raise --start-timeout")
    assert "    prterun: something went wrong" in finding.problem


# --- the tfring.torch job ----------------------------------------------------

def _torch_report(rank, **changes):
    floats, ints = launch_probes.expected_sums(2)
    report = {"hostname": "node1", "launch_rank": rank, "error": None,
              "torch": "2.13.0+cpu", "rank": rank, "size": 2,
              "float_sum": floats, "int_sum": ints}
    report.update(changes)
    return report


def test_a_working_torch_job_reports_torch_and_the_sums():
    findings = launch_checks.torch_job_findings(
        _result([_torch_report(1), _torch_report(0)]), 60)
    assert not [f for f in findings if f.problem]
    assert _lines(findings) == [
        "  PyTorch           2.13.0+cpu; tfring.torch imports",
        "  torch allreduce   ok: Sum gave float32 [3.0, 30.0] and int32 "
        "[3, -3] on both ranks (4.2 s)"]


def test_a_torch_job_that_fails_names_the_rank_and_the_error():
    reports = [_torch_report(0), {
        "hostname": "node1", "launch_rank": 1, "torch": "2.0.1",
        "error": "ImportError: tfring.torch needs torch 2.1 or later",
        "traceback": ""}]
    [finding] = launch_checks.torch_job_findings(_result(reports, 1), 60)
    assert finding.line() == "  PyTorch           FAILED: 2.0.1"
    assert finding.problem.startswith(
        "rank 1 of the 2-rank tfring.torch check job on node1 failed: "
        "ImportError: tfring.torch needs torch 2.1 or later. Expected "
        "tfring.torch to import with torch 2.0.1 and tfring.torch.init() and "
        "two allreduces to succeed.")


def test_a_torch_job_with_a_wrong_sum_or_no_end_fails():
    reports = [_torch_report(0), _torch_report(1, float_sum=[3.0, 3.0])]
    problems = [f for f in launch_checks.torch_job_findings(
        _result(reports), 60) if f.problem]
    assert problems[0].problem.startswith(
        "rank 1 got float32 [3.0, 3.0] and int32 [3, -3] from tfring.torch "
        "Sum allreduces. Expected [3.0, 30.0] and [3, -3].")
    [finding] = launch_checks.torch_job_findings(
        _result([_torch_report(0)], None), 60)
    assert finding.problem.startswith(
        "the 2-rank tfring.torch check job ran past the 60 s limit after "
        "4.2 s with 1 of 2 reports.")


def test_without_torch_the_build_check_says_so_and_passes(monkeypatch):
    real = launch_checks.importlib.util.find_spec
    monkeypatch.setattr(launch_checks.importlib.util, "find_spec",
                        lambda name: None if name == "torch" else real(name))
    findings, tensorflow_loads, torch_installed = \
        launch_checks._local_build_findings()
    assert tensorflow_loads and not torch_installed
    assert "  PyTorch           not installed (tfring.torch needs it, " \
           "TensorFlow jobs do not)" in _lines(findings)
    assert not [f for f in findings if f.problem]


# --- comparing hosts ---------------------------------------------------------

def _host(**changes):
    report = {"given_name": "h", "hostname": "h", "python": "3.11.7",
              "executable": "/venv/bin/python", "tensorflow": "2.21.0",
              "tfring": "0.1.0", "interfaces": ["eth0", "lo"], "error": None}
    report.update(changes)
    return report


def test_matching_hosts_pass():
    assert launch_checks.first_host_mismatch(
        _host(), [("a", _host()), ("b", _host())], ["eth0", "10.0.0.0/8",
                                                    "10.1.2.3"]) is None


@pytest.mark.parametrize("key, label, value", [
    ("python", "Python", "3.10.12"),
    ("tensorflow", "TensorFlow", "2.20.0"),
    ("tfring", "tfring", "0.0.9"),
])
def test_the_first_host_with_other_versions_is_named(key, label, value):
    hosts = [("a", _host()), ("b", _host(**{key: value})),
             ("c", _host(**{key: "9"}))]
    local = _host()
    assert launch_checks.first_host_mismatch(local, hosts) == (
        f"host b has {label} {value} (/venv/bin/python on b), this machine "
        f"has {label} {local[key]} (/venv/bin/python). Expected the same "
        f"{label} on every host (ranks built differently can disagree on "
        f"what they send). Install {label} {local[key]} on b, or run "
        f"tfringrun from an environment that matches b's.")


def test_a_host_where_tfring_does_not_import():
    broken = {"given_name": "b", "python": "3.11.7",
              "executable": "/venv/bin/python",
              "error": "ModuleNotFoundError: No module named 'tfring'"}
    assert launch_checks.first_host_mismatch(_host(), [("b", broken)]) == (
        "host b: importing tfring failed (/venv/bin/python on b): "
        "ModuleNotFoundError: No module named 'tfring'. Expected TensorFlow "
        "2.21.0 and tfring 0.1.0 to import there as they do here. Install "
        "the same environment on b at /venv/bin/python.")
    # A version it could still read comes first: it is the likely cause.
    broken["tensorflow"] = "2.20.0"
    assert launch_checks.first_host_mismatch(
        _host(), [("b", broken)]).startswith("host b has TensorFlow 2.20.0")


def test_network_interfaces_must_exist_everywhere():
    hosts = [("a", _host()), ("b", _host(interfaces=["ens5", "lo"]))]
    assert launch_checks.first_host_mismatch(_host(), hosts, ["eth0"]) == (
        "host b has no network interface 'eth0' (it has ens5, lo). Expected "
        "--network-interface to name interfaces that every host and this "
        "machine have. Name one they all have, or a subnet such as "
        "192.168.0.0/16.")
    assert launch_checks.first_host_mismatch(
        _host(), hosts, ["ib0"]).startswith(
        "this machine (which runs mpirun) has no network interface 'ib0'")


def test_the_host_report_code_reports_a_host_where_tfring_does_not_import(
        tmp_path):
    # A host whose tfring was built for another TensorFlow: `import tfring`
    # raises there. Fake packages stand in for both (no real import needed).
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(
        "__version__ = '2.99.0'\n")
    (tmp_path / "tfring").mkdir()
    (tmp_path / "tfring" / "__init__.py").write_text(
        "raise ImportError('tfring was built against TensorFlow 2.21.0')\n")
    done = subprocess.run(
        [sys.executable, "-c", launch_probes.HOST_REPORT_CODE, "node7"],
        env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=tmp_path,
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    [report] = launch_checks.JobResult([], 1, done.stdout, 0).reports()
    assert report == {
        "given_name": "node7", "python": sys.version.split()[0],
        "executable": sys.executable, "tensorflow": "2.99.0",
        "error": "ImportError: tfring was built against TensorFlow 2.21.0"}
    assert launch_checks.first_host_mismatch(
        _host(), [("node7", report)]).startswith(
        "host node7 has TensorFlow 2.99.0")


# --- a check's job ends at its time limit ------------------------------------

def _ended_within(pid, seconds):
    """Whether process `pid` is gone (or a zombie) within `seconds`: a
    killed process closes its files a moment before it is done exiting."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_job_past_its_limit_is_ended_with_all_its_processes(tmp_path):
    # Like mpirun: the command starts a child in a process group of its own.
    pid_file = tmp_path / "child"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(300)
    """)
    start = time.monotonic()
    result = launch_checks.run_job([sys.executable, "-c", script], 3)
    assert time.monotonic() - start < 30
    assert result.timed_out and result.ending(3) == "ran past the 3 s limit"
    assert "started" in result.output
    assert _ended_within(int(pid_file.read_text()), 5)


def _fake_mpirun(tmp_path, body):
    path = tmp_path / "mpirun"
    path.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = --version ]; then\n"
                    "  echo 'mpirun (Open MPI) 5.0.11'; exit 0\n"
                    "fi\n" + body)
    path.chmod(0o755)
    return str(path)


def test_check_build_with_a_hanging_mpirun_fails_at_its_limit(tmp_path):
    mpirun = _fake_mpirun(tmp_path, "echo 'waiting for daemons'\nsleep 300\n")
    out = io.StringIO()
    start = time.monotonic()
    args = runner.parse_args(["--check-build", "--start-timeout", "3"])
    assert launch_checks.check_build(args, *_facts(mpirun), out=out) == 1
    assert time.monotonic() - start < 60
    text = out.getvalue()
    assert f"  MPI launcher      {mpirun}: mpirun (Open MPI) 5.0.11" in text
    assert "  2-rank allreduce  FAILED: did not finish" in text
    assert ("tfringrun: check failed: 2-rank allreduce: the 2-rank check job "
            "ran past the 3 s limit after ") in text
    assert "    waiting for daemons" in text
    assert text.rstrip().endswith("1 check(s) failed")


def test_check_build_with_a_broken_mpirun_names_it(tmp_path):
    mpirun = tmp_path / "mpirun"
    mpirun.write_text("#!/bin/sh\necho 'libprrte.so: cannot open' >&2\n"
                      "exit 127\n")
    mpirun.chmod(0o755)
    out = io.StringIO()
    args = runner.parse_args(["--check-build"])
    assert launch_checks.check_build(args, *_facts(str(mpirun)),
                                     out=out) == 1
    assert (f"tfringrun: check failed: MPI launcher: `{mpirun} --version` "
            f"exited with status 127: 'libprrte.so: cannot open'. Expected "
            f"Open MPI's mpirun to print its version. Point TFRING_MPIRUN at "
            f"a working mpirun.") in out.getvalue()


# --- real runs ---------------------------------------------------------------

def _tfringrun(argv, timeout=600):
    done = subprocess.run([sys.executable, "-m", "tfring.launcher.cli"] + argv,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr


def test_check_build_passes_here():
    pytest.importorskip("mpi4py")
    # A generous limit: both ranks import TensorFlow, on a machine that may
    # be busy with other tests.
    rc, out, err = _tfringrun(["--check-build", "--start-timeout", "300"])
    assert rc == 0, out + err
    lines = out.splitlines()
    import tensorflow as tf
    assert (f"  TensorFlow        {tf.__version__}; the op library was built "
            f"for {tf.__version__} and loads") in lines
    assert any(line.startswith("  MPI library       Open MPI v")
               and line.endswith("thread level MPI_THREAD_MULTIPLE")
               for line in lines), out
    assert "  NCCL              no (tfring was built without NCCL)" in lines
    assert "  shared memory     yes (2 ranks on one host)" in lines
    assert any(line.startswith("  2-rank allreduce  ok: Sum gave float32 "
                               "[3.0, 30.0] and int32 [3, -3] on both ranks")
               for line in lines), out
    # tfring.torch, checked where torch is installed (without importing it
    # into a process that has TensorFlow).
    if importlib.util.find_spec("torch") is not None:
        version = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.__version__)"],
            capture_output=True, text=True, timeout=300).stdout.strip()
        assert f"  PyTorch           {version}; tfring.torch imports" in lines
        assert any(line.startswith(
            "  torch allreduce   ok: Sum gave float32 [3.0, 30.0] and int32 "
            "[3, -3] on both ranks") for line in lines), out
    else:
        assert ("  PyTorch           not installed (tfring.torch needs it, "
                "TensorFlow jobs do not)") in lines
    assert lines[-1] == "all checks passed"


def test_check_hosts_passes_for_localhost_and_this_machine():
    hostname = socket.gethostname()
    rc, out, err = _tfringrun(["--check-hosts", "-H",
                               f"localhost:2,{hostname}:2",
                               "--start-timeout", "300"])
    assert rc == 0, out + err
    lines = out.splitlines()
    assert lines[0] == f"tfringrun --check-hosts: localhost, {hostname}"
    for name in ("(this machine)", "localhost", hostname):
        assert any(line.startswith(f"  {name:<20} Python "
                                   f"{sys.version.split()[0]}, TensorFlow ")
                   for line in lines), (name, out)
    assert lines[-1] == ("all 2 host(s) reachable, with the versions this "
                         "machine has")


def test_check_hosts_names_a_host_that_does_not_resolve(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\nno-such-host.invalid slots=2\n")
    args = runner.parse_args(["--check-hosts", "--hostfile", str(hostfile),
                              "--start-timeout", "60"])
    out = io.StringIO()
    start = time.monotonic()
    assert launch_checks.check_hosts(args, *_facts(), out=out) == 1
    assert time.monotonic() - start < 60  # fails fast: no time limit hit
    text = out.getvalue()
    assert ("tfringrun: check failed: host no-such-host.invalid is not "
            "reachable through mpirun: starting Python there exited with "
            "status ") in text
    assert ("its name does not resolve on this machine" in text), text
    assert ("Check that the name resolves (/etc/hosts, DNS), that "
            "`ssh no-such-host.invalid true` works from here without a "
            "password prompt, and that ") in text
