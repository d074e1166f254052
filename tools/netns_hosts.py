# Several "hosts" on one Linux machine, built from namespaces, so that a test
# can run one tfring job across hosts without a cluster.
#
# Why: tfring behaves differently across hosts (local and cross ranks, no
# shared-memory segment, MPI over TCP, a remote launch through ssh). To see
# that on one machine, each host here gets what makes a machine distinct to
# MPI and to tfring:
#   * its own network namespace, joined to the others' through a bridge that
#     lives in a namespace of its own, with addresses in 10.254.0.0/24 that
#     exist only inside these namespaces;
#   * its own host name (UTS namespace) and its own /dev/shm and /etc/hosts
#     (mount namespace), so tfring's "same host name and same /dev/shm" test
#     for shared memory, and MPI's shared-memory transport, stay per host.
# A long-lived holder process keeps each host's UTS and mount namespaces
# alive; commands enter a host with `nsenter` on that holder. Open MPI
# reaches the other hosts through tools/netns_launch_agent.sh, set as
# PRRTE's ssh agent, which runs the daemon's command inside the named host.
#
# Cleanup: leaving the context ends every process inside the hosts' network
# namespaces and deletes the namespaces (their links go with them); inside
# the context SIGTERM raises KeyboardInterrupt, so a terminated run cleans up
# too. The holders die with the process that made them (parent-death
# signal), and namespaces left by a process that was killed outright carry
# its pid in their name, so the next run removes them.

import dataclasses
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading

import process_reaping  # tools/, next to this file

# Every namespace made here is named "<PREFIX><owner pid>-<role>".
PREFIX = "tfrnh"
SUBNET = ipaddress.ip_network("10.254.0.0/24")
AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "netns_launch_agent.sh")
# Room for MPI's and tfring's shared-memory segments on each host.
SHM_SIZE = "512m"
_TOOLS = ("ip", "nsenter", "unshare", "setpriv", "mount", "hostname")
_COMMAND_TIMEOUT_S = 30


def unavailable_reason():
    """Why hosts cannot be made here (a missing tool, or namespaces refused:
    no root, no CAP_NET_ADMIN / CAP_SYS_ADMIN), or None when they can."""
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    remove_stale()
    probe = f"{PREFIX}{os.getpid()}-probe"
    steps = [["ip", "netns", "add", probe],
             ["ip", "netns", "exec", probe, "unshare", "--uts", "--mount",
              "--propagation", "private", "sh", "-c",
              "hostname probe && mount -t tmpfs tmpfs /dev/shm"]]
    try:
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True,
                                    timeout=_COMMAND_TIMEOUT_S)
            if result.returncode != 0:
                return (f"`{' '.join(step[:4])} ...` failed: "
                        f"{result.stderr.strip()}")
    finally:
        _delete_namespace(probe)
    return None


@dataclasses.dataclass
class Host:
    name: str          # its host name, as MPI and tfring see it
    address: str       # its address on the test network
    namespace: str     # the `ip netns` name of its network namespace
    holder: subprocess.Popen = dataclasses.field(repr=False)

    def enter(self, argv, cwd=None):
        """The command that runs `argv` inside this host (network, host
        name, mounts), in `cwd` (default: the current directory; entering
        a mount namespace would otherwise start it in /)."""
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--uts",
                "--mount", f"--wd={os.path.abspath(cwd or os.getcwd())}",
                "--"] + list(argv)


def _run(argv):
    result = subprocess.run(argv, capture_output=True, text=True,
                            timeout=_COMMAND_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed with exit code "
                           f"{result.returncode}: {result.stderr.strip()}")
    return result.stdout


def _namespace_inode(namespace):
    try:
        return os.stat(f"/run/netns/{namespace}").st_ino
    except OSError:
        return None


def _pids_in_network_namespace(inode):
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                pids.append(int(entry))
        except OSError:  # gone meanwhile
            continue
    return pids


def _end_processes_in(namespace, deadline_s=10.0):
    """SIGKILLs every process inside `namespace`; waits until none is left."""
    inode = _namespace_inode(namespace)
    if inode is None:
        return
    left = process_reaping.kill_until_gone(
        lambda: _pids_in_network_namespace(inode), deadline_s, pause_s=0.05)
    if left:
        raise RuntimeError(f"processes {left} in network namespace "
                           f"{namespace} did not end after SIGKILL")


def _delete_namespace(namespace):
    _end_processes_in(namespace)
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True,
                   timeout=_COMMAND_TIMEOUT_S)


def _owner_alive(pid):
    """Whether process `pid` runs (a zombie has ended, it awaits reaping)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}: cleaning up the test hosts")


def remove_stale():
    """Deletes namespaces and work directories left by earlier runs whose
    process no longer exists (a run that was killed before its cleanup)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True,
                             text=True, timeout=_COMMAND_TIMEOUT_S).stdout
    pattern = re.compile(rf"^({PREFIX}(\d+)-\S+)")
    for line in listing.splitlines():
        match = pattern.match(line)
        if match and not _owner_alive(int(match.group(2))):
            _delete_namespace(match.group(1))
    work_pattern = re.compile(rf"^{PREFIX}(\d+)-")
    for entry in os.listdir(tempfile.gettempdir()):
        match = work_pattern.match(entry)
        if match and not _owner_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(tempfile.gettempdir(), entry),
                          ignore_errors=True)


class NetnsHosts:
    """A context manager: one host per name in `names`, on one network.

        with NetnsHosts(["hostA", "hostB"]) as hosts:
            env = dict(os.environ, **hosts.mpi_env())
            subprocess.run(hosts[0].enter(["mpirun", "-H", "hostA,hostB",
                                           "hostname"]), env=env)
    """

    def __init__(self, names):
        if len(names) > 250:
            raise ValueError(f"at most 250 hosts fit in {SUBNET}, got "
                             f"{len(names)}")
        self.names = list(names)
        self.hosts = []
        self.workdir = None
        self._namespaces = []
        self._tag = f"{PREFIX}{os.getpid()}"
        self._previous_sigterm = None

    def __getitem__(self, index):
        return self.hosts[index]

    def __enter__(self):
        remove_stale()
        self._interrupt_on_sigterm()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _interrupt_on_sigterm(self):
        # Only the main thread can set handlers; keep a handler someone set.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
            self._previous_sigterm = signal.signal(signal.SIGTERM,
                                                   _raise_interrupt)

    def _create(self):
        self.workdir = tempfile.mkdtemp(prefix=f"{self._tag}-")
        addresses = [str(SUBNET[i + 1]) for i in range(len(self.names))]
        hosts_file = os.path.join(self.workdir, "hosts")
        with open(hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for address, name in zip(addresses, self.names):
                f.write(f"{address} {name}\n")
        switch = f"{self._tag}-sw"
        self._add_namespace(switch)
        _run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", switch, "link", "set", "br0", "up"])
        for index, (name, address) in enumerate(zip(self.names, addresses)):
            namespace = f"{self._tag}-h{index}"
            self._add_namespace(namespace)
            # One veth pair: "eth0" inside the host, "port<i>" on the bridge.
            _run(["ip", "-n", namespace, "link", "add", "eth0", "type", "veth",
                  "peer", "name", f"port{index}", "netns", switch])
            _run(["ip", "-n", switch, "link", "set", f"port{index}", "master",
                  "br0", "up"])
            _run(["ip", "-n", namespace, "addr", "add",
                  f"{address}/{SUBNET.prefixlen}", "dev", "eth0"])
            _run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
            _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
            holder = self._start_holder(namespace, name, hosts_file)
            self.hosts.append(Host(name, address, namespace, holder))
            with open(os.path.join(self.workdir, f"{name}.pid"), "w") as f:
                f.write(f"{holder.pid}\n")

    def _add_namespace(self, namespace):
        _run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)

    def _start_holder(self, namespace, name, hosts_file):
        # Sets the host name, mounts a fresh /dev/shm and the hosts file in a
        # private mount namespace, says "ready", then sleeps until killed.
        setup = (f"hostname {name} && "
                 f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs "
                 f"/dev/shm && "
                 f"mount --bind {hosts_file} /etc/hosts && "
                 f"echo ready && exec sleep infinity")
        holder = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "ip", "netns", "exec", namespace,
             "unshare", "--uts", "--mount", "--propagation", "private",
             "sh", "-c", setup],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = holder.stdout.readline().strip()
        if line != "ready":
            holder.kill()
            _, error = holder.communicate(timeout=_COMMAND_TIMEOUT_S)
            raise RuntimeError(f"could not set up host {name} in network "
                               f"namespace {namespace}: {error.strip()}")
        return holder

    def agent(self):
        """PRRTE's ssh agent for these hosts (`plm_ssh_agent`)."""
        return f"{AGENT} {self.workdir}"

    def mpi_env(self):
        """Environment that makes Open MPI launch on these hosts through the
        agent and talk over the test network only."""
        subnet = str(SUBNET)
        return {
            "PRTE_MCA_plm_ssh_agent": self.agent(),
            "PRTE_MCA_oob_tcp_if_include": subnet,
            "OMPI_MCA_btl_tcp_if_include": subnet,
        }

    def write_hostfile(self, slots_by_host):
        """Writes an mpirun hostfile (`host slots=N` lines) for
        `slots_by_host` ({host name: slots}); returns its path."""
        path = os.path.join(self.workdir, "hostfile")
        with open(path, "w") as f:
            for name, slots in slots_by_host.items():
                f.write(f"{name} slots={slots}\n")
        return path

    def stray_processes(self):
        """`pid: command line` of every process inside the hosts except the
        holders: after a job has ended, there should be none."""
        holders = {host.holder.pid for host in self.hosts}
        strays = []
        for host in self.hosts:
            for pid in _pids_in_network_namespace(
                    _namespace_inode(host.namespace)):
                if pid in holders:
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        command = f.read().replace(b"\0", b" ").decode(
                            errors="replace").strip()
                except OSError:  # ended meanwhile
                    continue
                strays.append(f"{pid} on {host.name}: {command}")
        return strays

    def close(self):
        """Ends every process in the hosts and deletes everything made."""
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        errors = []
        for namespace in reversed(self._namespaces):
            try:
                _delete_namespace(namespace)
            except Exception as e:  # keep deleting the rest
                errors.append(e)
        for host in self.hosts:
            try:
                host.holder.wait(_COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired as e:
                errors.append(e)
            for stream in (host.holder.stdout, host.holder.stderr):
                stream.close()
        self._namespaces, self.hosts = [], []
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        if errors:
            raise RuntimeError(f"cleanup of the test hosts failed: {errors}")
