# Which network ports a tfringrun job opens, seen from the outside.
#
# Why: a job whose ranks share one host needs no network, so its ranks must
# not listen where other machines can reach them (Open MPI's TCP transport
# otherwise listens on every address, ports from 1024, in every rank). The
# tests start real 2-rank jobs, list the listening sockets of every process
# of the job (/proc/net/{tcp,tcp6,udp,udp6} matched to /proc/PID/fd), and
# check where each one listens. A plain mpirun job is measured the same way
# to show that the listing sees rank listeners when there are some.

import glob
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

import mpi_launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAITING_JOB = os.path.join(REPO, "tests", "job_scripts", "waiting_job.py")
START_SECONDS = 300  # ranks import TensorFlow; the machine may be busy

# /proc/net files: (protocol, file, state of a socket that accepts
# connections or datagrams from anyone: TCP LISTEN, UDP unconnected).
_SOCKET_TABLES = (("tcp", "/proc/net/tcp", "0A"),
                  ("tcp6", "/proc/net/tcp6", "0A"),
                  ("udp", "/proc/net/udp", "07"),
                  ("udp6", "/proc/net/udp6", "07"))


def _address(hex_address):
    """'0100007F:1F90' -> ('127.0.0.1', 8080); the same for IPv6."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port, 16)


def _listening_sockets():
    """{socket inode: (protocol, address, port)} in this network
    namespace."""
    found = {}
    for protocol, path, state in _SOCKET_TABLES:
        try:
            with open(path) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue  # No IPv6 here.
        for row in rows:
            fields = row.split()
            if fields[3] == state:
                found[fields[9]] = (protocol,) + _address(fields[1])
    return found


def _sockets_of(pid, listening):
    """The entries of `listening` that process `pid` holds open."""
    held = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return held
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = target[len("socket:["):-1]
            if inode in listening:
                held.append(listening[inode])
    return sorted(set(held))


def _argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _is_loopback(address):
    return ipaddress.ip_address(address).is_loopback


def _is_wildcard(address):
    return ipaddress.ip_address(address).is_unspecified


class _Job:
    """A job started in its own session and tagged (see mpi_launch.py), so
    its processes can be found and are all ended afterwards."""

    def __init__(self, argv, env):
        self.tag = uuid.uuid4().hex
        env = dict(env, **{mpi_launch.TAG_VARIABLE: self.tag})
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     errors="replace",
                                     start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_lines(self, prefix, count, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if sum(line.startswith(prefix) for line in self.lines) >= count:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        where = self.where_stuck()
        self.end()
        pytest.fail(f"expected {count} lines starting with {prefix!r} "
                    f"within {seconds} s; output:\n" + "\n".join(self.lines)
                    + f"\nwhere the job's processes were:\n{where}")

    def where_stuck(self):
        """Each process of the job with its threads' states and kernel wait
        channels, and the stacks of up to two ranks (where gdb is found):
        what a job that stopped making progress was doing."""
        report = []
        stacked = 0
        for pid in sorted(mpi_launch._tagged_pids(self.tag)):
            argv = _argv(pid)
            report.append(f"{pid}: {' '.join(argv)[:160]}")
            for task in sorted(glob.glob(f"/proc/{pid}/task/*")):
                try:
                    with open(f"{task}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                    with open(f"{task}/comm") as f:
                        comm = f.read().strip()
                    with open(f"{task}/wchan") as f:
                        wchan = f.read()
                except OSError:
                    continue
                report.append(f"  thread {os.path.basename(task)} {comm} "
                              f"{state} {wchan}")
            if (stacked < 2 and shutil.which("gdb")
                    and argv and "python" in os.path.basename(argv[0])):
                stacked += 1
                try:
                    stacks = subprocess.run(
                        ["gdb", "-batch", "-p", str(pid),
                         "-ex", "thread apply all bt 25"],
                        capture_output=True, text=True, timeout=120).stdout
                except subprocess.TimeoutExpired:
                    stacks = "(gdb did not answer within 120 s)"
                report.extend(line[:160] for line in stacks.splitlines()
                              if line.startswith(("#", "Thread")))
        return "\n".join(report)

    def listeners(self):
        """{pid: (argv, [(protocol, address, port)])} for every process of
        the job."""
        listening = _listening_sockets()
        return {pid: (_argv(pid), _sockets_of(pid, listening))
                for pid in mpi_launch._tagged_pids(self.tag)}

    def finish(self, seconds):
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            left = {pid: _argv(pid)
                    for pid in mpi_launch._tagged_pids(self.tag)}
            self.end()
            pytest.fail(f"the job did not finish within {seconds} s; still "
                        f"running: {left}; output:\n" + "\n".join(self.lines))
        self._reader.join(10)
        mpi_launch._kill_tagged(self.tag)
        return self.proc.returncode

    def end(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        mpi_launch._kill_tagged(self.tag)


@pytest.fixture(scope="module")
def tfringrun_job(tmp_path_factory):
    """A 2-rank tfringrun job: its exit status, its output, and, read while
    it waits, each of its processes' listeners and environment."""
    release = tmp_path_factory.mktemp("exposure") / "release"
    job = _Job([sys.executable, "-m", "tfring.launcher.cli", "--verbose",
                "-np", "2", sys.executable, WAITING_JOB, str(release)],
               mpi_launch.working_tree_env())
    try:
        job.wait_for_lines("ready rank", 2, START_SECONDS)
        listeners = job.listeners()
        environs = {pid: _environ(pid) for pid in listeners}
    finally:
        release.touch()
    returncode = job.finish(120)
    return returncode, "\n".join(job.lines), listeners, environs


def _ranks(listeners, script=WAITING_JOB):
    """The processes that run `script` (mpirun's own command line names it
    too, further on)."""
    return {pid: found for pid, found in listeners.items()
            if found[0][1:2] == [script]}


def test_the_job_runs_on_shared_memory(tfringrun_job):
    returncode, output, listeners, _ = tfringrun_job
    assert returncode == 0, output
    assert sorted(line for line in output.splitlines()
                  if line.startswith("done rank")) == ["done rank 0",
                                                       "done rank 1"]
    assert output.count("shm True") == 2, output
    assert len(_ranks(listeners)) == 2, listeners
    # The --verbose echo: one host, so no TCP transport.
    assert "--mca btl self,sm" in output


def test_ranks_of_a_one_host_job_listen_on_no_port(tfringrun_job):
    _, _, listeners, _ = tfringrun_job
    ranks = _ranks(listeners)
    assert ranks
    for pid, (argv, sockets) in ranks.items():
        assert sockets == [], f"rank {pid} ({argv}) listens on {sockets}"


def test_the_launcher_listens_on_loopback_only(tfringrun_job):
    # mpirun's PMIx server (the ranks' link to it) listens on 127.0.0.1.
    # PRRTE 3.0 would bind its daemon channel to the wildcard address;
    # tfringrun preloads libtfring_loopback_listeners.so into mpirun, which
    # keeps that channel on loopback too.
    _, _, listeners, _ = tfringrun_job
    launcher = {pid: found for pid, found in listeners.items()
                if pid not in _ranks(listeners)}
    assert launcher, listeners
    for pid, (argv, sockets) in launcher.items():
        for protocol, address, port in sockets:
            assert _is_loopback(address), \
                f"{argv} listens on {protocol} {address}:{port}"
    # The daemon channel is still there (IPv4, and IPv6 where the machine
    # has it), only on loopback: the listing is not simply empty.
    assert len([address for _, sockets in launcher.values()
                for _, address, _ in sockets]) >= 2, launcher


def test_the_ranks_do_not_inherit_the_preloaded_library(tfringrun_job):
    # The library takes itself out of LD_PRELOAD in prterun, so a server in
    # the user's script still binds where it asks.
    _, _, listeners, environs = tfringrun_job
    assert _ranks(listeners)
    launcher = [pid for pid in listeners if pid not in _ranks(listeners)]
    # mpirun itself was started with it (its environment says so) ...
    assert any("LD_PRELOAD=" in environs[pid] and
               "libtfring_loopback_listeners" in environs[pid]
               for pid in launcher), {pid: listeners[pid][0]
                                      for pid in launcher}
    # ... and the ranks were not.
    for pid in _ranks(listeners):
        assert environs[pid], f"rank {pid}: environment not read"
        assert "libtfring_loopback_listeners" not in environs[pid], pid


def test_plain_mpirun_ranks_do_listen_on_every_address(tmp_path):
    # The measurement itself: without tfringrun's options Open MPI's TCP
    # transport listens in every rank, and the listing must see it.
    pytest.importorskip("mpi4py")
    release = tmp_path / "release"
    script = ("import os, sys, time\n"
              "from mpi4py import MPI\n"
              "c = MPI.COMM_WORLD\n"
              "print(f'ready rank {c.Get_rank()}', flush=True)\n"
              "deadline = time.monotonic() + 120\n"
              "while not os.path.exists(sys.argv[1]) and "
              "time.monotonic() < deadline:\n"
              "    time.sleep(0.1)\n"
              "c.Barrier()\n")
    job = _Job(mpi_launch.mpirun_command(
        2, [sys.executable, "-c", script, str(release)]),
        mpi_launch.working_tree_env())
    try:
        job.wait_for_lines("ready rank", 2, START_SECONDS)
        listeners = job.listeners()
    finally:
        release.touch()
    assert job.finish(60) == 0, "\n".join(job.lines)
    ranks = _ranks(listeners, script="-c")
    assert len(ranks) == 2, listeners
    for pid, (_, sockets) in ranks.items():
        assert any(protocol.startswith("tcp") and _is_wildcard(address)
                   for protocol, address, _ in sockets), (pid, sockets)


def test_two_names_of_this_machine_are_one_host(tmp_path):
    # `-H localhost:1,<hostname>:1` names this machine twice: mpirun runs
    # both ranks here, so tfringrun must treat the job as a one-host job
    # (no TCP transport in the ranks, mpirun on loopback), not as a job
    # across two hosts that listens on every address.
    pytest.importorskip("mpi4py")
    release = tmp_path / "release"
    script = ("import os, sys, time\n"
              "from mpi4py import MPI\n"
              "c = MPI.COMM_WORLD\n"
              "print(f'ready rank {c.Get_rank()} of {c.Get_size()}', "
              "flush=True)\n"
              "deadline = time.monotonic() + 120\n"
              "while not os.path.exists(sys.argv[1]) and "
              "time.monotonic() < deadline:\n"
              "    time.sleep(0.1)\n"
              "c.Barrier()\n")
    hosts = f"localhost:1,{socket.gethostname()}:1"
    job = _Job([sys.executable, "-m", "tfring.launcher.cli", "--verbose",
                "-np", "2", "-H", hosts, sys.executable, "-c", script,
                str(release)], mpi_launch.working_tree_env())
    try:
        job.wait_for_lines("ready rank", 2, START_SECONDS)
        listeners = job.listeners()
    finally:
        release.touch()
    assert job.finish(60) == 0, "\n".join(job.lines)
    output = "\n".join(job.lines)
    assert sorted(line for line in job.lines if line.startswith("ready")) == \
        ["ready rank 0 of 2", "ready rank 1 of 2"], output
    assert "--mca btl self,sm" in output  # the --verbose echo
    ranks = _ranks(listeners, script="-c")
    assert len(ranks) == 2, listeners
    for pid, (argv, sockets) in listeners.items():
        for protocol, address, port in sockets:
            assert pid not in ranks, f"rank {pid} listens on {sockets}"
            assert _is_loopback(address), \
                f"{argv} listens on {protocol} {address}:{port}"
