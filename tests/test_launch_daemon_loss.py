# Tests of tfringrun's watch on mpirun's stderr (tfring/launcher/daemon_loss.py,
# tfring/launcher/supervise.py) without MPI: a fake mpirun prints what
# PRRTE 3.0 prints when it loses a host's daemon and exits 0, and tfringrun
# must exit with daemon_loss.EXIT_STATUS and say what happened; anything
# else mpirun writes to stderr reaches tfringrun's stderr unchanged, as it
# comes. The real loss, a host's prted killed mid-step, is
# tests/test_elastic_multihost.py's.

import os
import subprocess
import sys

import pytest

from tfring.launcher import daemon_loss

import mpi_launch

# PRRTE 3.0.11's node-died message as prterun prints it
# (help-errmgr-base.txt, with pmix_show_help's rules around it).
NODE_DIED = (
    b"--------------------------------------------------------------------------\n"
    b"PRTE has lost communication with a remote daemon.\n"
    b"\n"
    b"  HNP daemon   : [prterun-hostA-4242@0,0] on node hostA\n"
    b"  Remote daemon: [prterun-hostA-4242@0,1] on node hostB\n"
    b"\n"
    b"This is usually due to either a failure of the TCP network\n"
    b"connection to the node, or possibly an internal failure of\n"
    b"the daemon itself. We cannot recover from this failure, and\n"
    b"therefore will terminate the job.\n"
    b"--------------------------------------------------------------------------\n")
KEY_PHRASE = "because it lost contact with the daemon on"


def _watched(chunks):
    watch = daemon_loss.Watch()
    for chunk in chunks:
        watch.feed(chunk)
    return watch


@pytest.mark.parametrize("cut", range(0, len(NODE_DIED) + 1, 7))
def test_the_message_is_found_however_the_reads_split_it(cut):
    before = b"rank 1: step 7\n" * 50
    watch = _watched([before + NODE_DIED[:cut], NODE_DIED[cut:], b"more\n"])
    assert watch.lost and watch.host == "hostB"


def test_the_message_is_found_one_byte_at_a_time():
    watch = _watched(bytes([b]) for b in NODE_DIED)
    assert watch.lost and watch.host == "hostB"


def test_a_message_without_its_host_line_is_still_a_loss():
    watch = _watched([NODE_DIED.split(b"  HNP")[0]])
    assert watch.lost and watch.host is None
    assert "on a remote host" in str(daemon_loss.error(None, 0))


def test_other_output_is_no_loss():
    watch = _watched([b"PRTE has lost", b" nothing\n", b"Remote daemon: x "
                      b"on node hostB\n", NODE_DIED[:40]])
    assert not watch.lost and watch.host is None


def _fake_mpirun(tmp_path, body):
    """An executable `mpirun` that runs the Python `body` (its arguments,
    mpirun's, are ignored)."""
    path = tmp_path / "mpirun"
    path.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}\n")
    path.chmod(0o755)
    return path


def _tfringrun(tmp_path, body, *extra_args, **popen):
    env = mpi_launch.working_tree_env(
        TFRING_MPIRUN=str(_fake_mpirun(tmp_path, body)))
    return subprocess.Popen(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
         *extra_args, "true"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True, **popen)


def _finish(proc, timeout=120):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    return proc.returncode, out, err


@pytest.mark.parametrize("elastic", [[], ["--min-np", "1"]])
def test_a_lost_daemon_is_an_error_though_mpirun_exits_0(tmp_path, elastic):
    # The elastic flags only change mpirun's arguments, which the fake
    # ignores: both kinds of job end the same way.
    body = (f"sys.stdout.write('rank output\\n')\n"
            f"sys.stderr.buffer.write({NODE_DIED!r})\n"
            f"sys.exit(0)")
    rc, out, err = _finish(_tfringrun(tmp_path, body, *elastic))
    assert rc == daemon_loss.EXIT_STATUS == 75, err
    assert out == b"rank output\n"
    # PRRTE's message comes first, unchanged, then tfringrun's.
    assert err.startswith(NODE_DIED), err
    said = err[len(NODE_DIED):].decode()
    assert said.startswith("tfringrun: error: Open MPI's runtime (PRRTE) "
                           "ended the job " + KEY_PHRASE + " host hostB"), said
    assert "although mpirun exited with status 0" in said, said
    assert "restart the job from its last checkpoint" in said, said
    assert "Exit status 75." in said, said


def test_stderr_passes_through_unchanged_and_the_status_too(tmp_path):
    noise = bytes(range(256)) * 300 + b"no newline at the end"
    body = (f"sys.stderr.buffer.write({noise!r})\n"
            f"sys.stdout.write('out\\n')\n"
            f"sys.exit(3)")
    rc, out, err = _finish(_tfringrun(tmp_path, body))
    assert (rc, out, err) == (3, b"out\n", noise)


def test_stderr_reaches_tfringruns_stderr_while_mpirun_runs(tmp_path):
    # The fake writes a line, then waits until the test has read it from
    # tfringrun's stderr (it makes a file then): the line was not held back
    # until mpirun ended.
    seen = tmp_path / "seen"
    body = (f"sys.stderr.write('half a line, then'); sys.stderr.flush()\n"
            f"while not os.path.exists({str(seen)!r}):\n"
            f"    time.sleep(0.05)\n"
            f"sys.stderr.write(' the rest\\n')")
    proc = _tfringrun(tmp_path, body)
    first = b""
    try:
        while not first.endswith(b"then"):
            chunk = os.read(proc.stderr.fileno(), 1000)
            if not chunk:
                break
            first += chunk
        seen.touch()
    finally:
        rc, _, rest = _finish(proc)
    assert (rc, first + rest) == (0, b"half a line, then the rest\n")


# An elastic job that PRRTE ended on losing a host's daemon starts again on
# the other hosts (tfring/launcher/restart.py). The fake mpirun loses the
# host named by its call number (a counter file) and records each call's
# arguments, so the test sees what tfringrun asked of each launch.
_LOSES_HOSTS = """
calls = {calls!r}
n = len(os.listdir(calls))
with open(os.path.join(calls, str(n)), "w") as f:
    f.write("\\n".join(sys.argv[1:]))
lost = {lost!r}
if n < len(lost):
    sys.stderr.buffer.write({node_died!r}.replace(b"hostB", lost[n].encode()))
sys.exit(0)
"""


def _elastic_job(tmp_path, lost, *options):
    calls = tmp_path / "calls"
    calls.mkdir()
    body = _LOSES_HOSTS.format(calls=str(calls), lost=[h for h in lost],
                               node_died=NODE_DIED)
    env = mpi_launch.working_tree_env(
        TFRING_MPIRUN=str(_fake_mpirun(tmp_path, body)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "3",
         "-H", "hostA:1,hostB.cluster:1,hostC:1", *options, "true"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True)
    rc, _, err = _finish(proc)
    launches = [(calls / str(i)).read_text().split("\n")
                for i in range(len(list(calls.iterdir())))]
    return rc, err.decode(), launches


def _value(argv, option):
    return argv[argv.index(option) + 1]


def test_an_elastic_job_starts_again_without_the_lost_host(tmp_path):
    rc, err, launches = _elastic_job(tmp_path, ["hostB"], "--min-np", "2")
    assert rc == 0, err
    assert len(launches) == 2, err
    first, second = launches
    assert (_value(first, "-np"), _value(first, "-H")) == (
        "3", "hostA:1,hostB.cluster:1,hostC:1")
    # PRRTE named hostB; -H said hostB.cluster: the same short name.
    assert (_value(second, "-np"), _value(second, "-H")) == (
        "2", "hostA:1,hostC:1")
    assert "TFRING_ELASTIC_RESTARTS=1" in second, second
    assert not any(a.startswith("TFRING_ELASTIC_RESTARTS") for a in first)
    assert "TFRING_ELASTIC_MAX_NP=3" in second, second
    assert ("tfringrun: starting the job again without host hostB, at 2 "
            "ranks on hostA:1,hostC:1 (restart 1;") in err, err
    assert "tfringrun: error" not in err, err


@pytest.mark.parametrize("options, lost, why", [
    (["--min-np", "1", "--reset-limit", "1"], ["hostB", "hostC"],
     "a restart would be more resets than --reset-limit 1"),
    (["--min-np", "3"], ["hostB"],
     "the hosts left have 2 slot(s), fewer than --min-np 3"),
    (["--min-np", "1"], ["hostD"],
     "host hostD is not among the job's hosts (-H/--hostfile)"),
])
def test_an_elastic_job_that_cannot_start_again_ends_with_the_reason(
        tmp_path, options, lost, why):
    rc, err, launches = _elastic_job(tmp_path, lost, *options)
    assert rc == daemon_loss.EXIT_STATUS, err
    assert len(launches) == len(lost), err
    assert (KEY_PHRASE + f" host {lost[-1]}") in err, err
    assert ("tfringrun did not start the job again on the other hosts: "
            + why) in err, err


def test_a_fixed_size_job_is_not_started_again(tmp_path):
    rc, err, launches = _elastic_job(tmp_path, ["hostB"])
    assert rc == daemon_loss.EXIT_STATUS and len(launches) == 1, err
    assert "did not start the job again" not in err, err
