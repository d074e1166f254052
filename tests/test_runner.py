# Tests of tfringrun (tfring/launcher/cli.py, tfring/launcher/command.py,
# tfring/launcher/knobs.py): the mpirun command line and the host lists are
# read and built by pure functions, tested here without MPI; real 2-rank
# launches check that the command it execs starts a job, that the TFRING_*
# flags reach every rank and that --output-filename writes per-rank files.

import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tfring import _core
from tfring.launcher import command as launch_command
from tfring.launcher import hosts as launch_hosts
from tfring.launcher import knobs as launch_knobs
from tfring.launcher import cli as runner

import mpi_launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(argv, environ=None, euid=1000, cpu_count=8):
    args = runner.parse_args(argv)
    return launch_command.mpirun_command(args, "/opt/mpi/bin/mpirun",
                                         environ or {}, euid, cpu_count)


def test_plain_command():
    assert command(["-np", "2", "python", "train.py", "--steps", "3"]) == [
        "/opt/mpi/bin/mpirun", "-np", "2", "--bind-to", "none",
        "--mca", "pml", "ob1", "--mca", "btl", "self,sm",
        "python", "train.py", "--steps", "3"]


def test_options_after_the_program_belong_to_the_program():
    cmd = command(["-np", "2", "python", "t.py", "-np", "5", "--verbose"])
    assert cmd[-5:] == ["python", "t.py", "-np", "5", "--verbose"]
    assert cmd[1:3] == ["-np", "2"]


def test_double_dash_separates_the_program():
    assert command(["--verbose", "-np", "2", "--", "--odd-program"])[-1] == \
        "--odd-program"


def test_a_python_script_runs_with_this_python():
    assert command(["-np", "2", "train.py", "--epochs", "3"])[-4:] == [
        sys.executable, "train.py", "--epochs", "3"]
    assert command(["-np", "2", "--", "dir/train.py"])[-2:] == [
        sys.executable, "dir/train.py"]
    # Named interpreters and other programs run as given.
    assert command(["-np", "2", "python3", "train.py"])[-2:] == [
        "python3", "train.py"]
    assert command(["-np", "2", "./run.sh", "x.py"])[-2:] == [
        "./run.sh", "x.py"]


@pytest.mark.parametrize("argv, unknown", [
    (["-n", "2", "p"], "-n"),                  # mpirun's spelling of -np
    (["--verbos", "-np", "2", "p"], "--verbos"),
    (["-np", "2", "--fusion-threshold", "64", "p"], "--fusion-threshold"),
    (["-c"], "-c"),                            # not -cb
    (["-np", "2", "--network", "eth0", "p"], "--network"),
])
def test_options_are_not_abbreviated(argv, unknown, capsys):
    with pytest.raises(SystemExit) as e:
        runner.parse_args(argv)
    assert e.value.code == 2
    assert (f"tfringrun: error: unknown option {unknown}. Expected "
            f"tfringrun's options spelled in full, as `tfringrun --help` "
            f"lists them (`-np 2`, not `-n 2`); the program's own options go "
            f"after the program.") in capsys.readouterr().err


def test_documented_short_options_still_work():
    args = runner.parse_args(["-cb", "-np", "2", "-Hlocalhost:2", "p", "-n"])
    assert args.check_build and args.num_proc == 2
    assert args.hosts == "localhost:2" and args.command == ["p", "-n"]
    assert runner.parse_args(["-np", "2", "-H", "a:1,b:1", "p"]).hosts == \
        "a:1,b:1"


def test_root_adds_allow_run_as_root():
    assert "--allow-run-as-root" in command(["-np", "2", "p"], euid=0)
    assert "--allow-run-as-root" not in command(["-np", "2", "p"], euid=1000)


def _hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("argv, cpus, expected", [
    (["-np", "4", "p"], 2, True),
    (["-np", "2", "p"], 2, False),
    (["-np", "4", "-H", "localhost:4", "p"], 2, True),
    (["-np", "4", "-H", "a:2,b:2", "p"], 2, False),
    (["-np", "4", "--hostfile", "HOSTFILE", "p"], 2, False),
    (["-np", "2", "p"], None, True),
])
def test_oversubscribe_only_past_the_cores_of_a_single_host(argv, cpus,
                                                            expected,
                                                            tmp_path):
    hostfile = _hostfile(tmp_path, "a slots=2\n")
    argv = [hostfile if word == "HOSTFILE" else word for word in argv]
    assert ("--oversubscribe" in command(argv, cpu_count=cpus)) == expected


def test_hosts_and_hostfile_are_passed_on(tmp_path):
    cmd = command(["-np", "4", "-H", "a:2,b:2", "p"])
    assert cmd[cmd.index("-H") + 1] == "a:2,b:2"
    hostfile = _hostfile(tmp_path, "a slots=2\nb slots=2\n")
    cmd = command(["-np", "4", "--hostfile", hostfile, "p"])
    assert cmd[cmd.index("--hostfile") + 1] == hostfile


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


def test_num_proc_is_needed_only_to_run_a_command(capsys):
    assert runner.parse_args(["--check-build"]).command == []
    assert runner.parse_args(["-cb"]).check_build
    with pytest.raises(SystemExit):
        runner.parse_args(["--check-build", "python", "t.py"])
    assert "-np/--num-proc is required to run a command" in \
        capsys.readouterr().err
    args = runner.parse_args(["--check-build", "-np", "2", "python", "t.py"])
    assert args.check_build and args.command == ["python", "t.py"]


def test_check_hosts_needs_hosts(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["--check-hosts"])
    assert "--check-hosts needs the hosts to check; expected -H " in \
        capsys.readouterr().err
    assert runner.parse_args(["--check-hosts", "-H", "a:2,b:2"]).check_hosts


# --- where the job may listen and which network it uses ----------------------

ONE_HOST = ["--mca", "pml", "ob1", "--mca", "btl", "self,sm"]


def _contains(cmd, words):
    return any(cmd[i:i + len(words)] == words for i in range(len(cmd)))


@pytest.mark.parametrize("hosts, one_host", [
    ([], True),
    (["-H", "localhost:4"], True),
    (["-H", "gpu7:4"], True),                 # one host, another machine
    (["-H", "a:2,a:2"], True),
    (["-H", "a:2,b:2"], False),
    (["--hostfile", "ONE"], True),
    (["--hostfile", "TWO"], False),
])
def test_ranks_on_one_host_use_no_tcp_transport(hosts, one_host, tmp_path):
    files = {"ONE": _hostfile(tmp_path, "# one host\na slots=4\n"),
             "TWO": str(tmp_path / "two")}
    (tmp_path / "two").write_text("a slots=2\nb slots=2 max_slots=4\n")
    argv = ["-np", "4"] + [files.get(word, word) for word in hosts] + ["p"]
    cmd = command(argv)
    assert _contains(cmd, ONE_HOST) == one_host


def _outgoing_address():
    """This machine's address on its default route, or None without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # sends nothing
            return probe.getsockname()[0]
    except OSError:
        return None


@pytest.mark.parametrize("names, one_host", [
    # Names of this machine are one host, whatever their spelling ...
    (["localhost", "HOSTNAME"], True),
    (["localhost", "127.0.0.1"], True),
    (["HOSTNAME", "ADDRESS"], True),
    # ... another machine's name is another host ...
    (["localhost", "no-such-host.invalid"], False),
    (["HOSTNAME", "192.0.2.254"], False),
    # ... and one name is one host, wherever it is.
    (["gpu7"], True),
])
def test_one_host_is_decided_by_what_the_names_resolve_to(names, one_host):
    address = _outgoing_address()
    if "ADDRESS" in names and address is None:
        pytest.skip("this machine has no default route")
    names = [{"HOSTNAME": socket.gethostname(), "ADDRESS": address}.get(n, n)
             for n in names]
    hosts = ",".join(f"{name}:1" for name in names)
    cmd = command(["-np", str(len(names)), "-H", hosts, "p"])
    assert _contains(cmd, ONE_HOST) == one_host, names
    assert _contains(cmd, launch_command.FAULT_TOLERANT_MPI) != one_host
    env = launch_command.launcher_environment(
        runner.parse_args(["-np", "2", "-H", hosts, "p"]), {},
        "/pkg/libtfring_loopback_listeners.so")
    assert ("LD_PRELOAD" in env) == one_host


@pytest.mark.parametrize("hosts, environ, fault_tolerant", [
    (["-H", "a:2,b:2"], {}, True),
    ([], {}, False),                  # one host: shared memory names the dead
    (["-H", "a:2,a:2"], {}, False),
    # The user's own setting wins, off or on.
    (["-H", "a:2,b:2"], {"OMPI_MCA_mpi_ft_enable": "0"}, False),
    (["-H", "a:2,b:2"], {"OMPI_MCA_mpi_ft_enable": "1"}, False),
])
def test_several_hosts_run_in_fault_tolerant_mode(hosts, environ,
                                                  fault_tolerant):
    cmd = command(["-np", "4"] + hosts + ["p"], environ=environ)
    assert _contains(cmd, launch_command.FAULT_TOLERANT_MPI) == fault_tolerant
    assert _contains(cmd, ["--mca", "mpi_ft_enable", "1"]) == fault_tolerant


@pytest.mark.parametrize("hosts, environ, library, preload", [
    # One host: mpirun starts with the loopback library ahead of the
    # user's own preloads.
    ([], {}, "/pkg/libtfring_loopback_listeners.so",
     "/pkg/libtfring_loopback_listeners.so"),
    (["-H", "gpu7:4"], {"LD_PRELOAD": "/opt/libjemalloc.so"},
     "/pkg/libtfring_loopback_listeners.so",
     "/pkg/libtfring_loopback_listeners.so:/opt/libjemalloc.so"),
    # Several hosts: other daemons must reach mpirun's channel; held to
    # the interfaces only when they are named.
    (["-H", "a:2,b:2"], {"LD_PRELOAD": "/opt/libjemalloc.so"},
     "/pkg/libtfring_loopback_listeners.so", "/opt/libjemalloc.so"),
    (["-H", "a:2,b:2", "--network-interface", "eth1"], {},
     "/pkg/libtfring_loopback_listeners.so",
     "/pkg/libtfring_loopback_listeners.so"),
    # Not built (not Linux): nothing to preload.
    ([], {}, None, None),
])
def test_one_host_jobs_keep_mpirun_on_loopback(hosts, environ, library,
                                               preload):
    args = runner.parse_args(["-np", "4"] + hosts + ["p"])
    env = launch_command.launcher_environment(
        args, dict(environ, HOME="/root"), library)
    assert env.get("LD_PRELOAD") == preload
    assert env["HOME"] == "/root"
    assert env.get("TFRING_LISTEN_ON") == (
        "eth1" if "--network-interface" in hosts else None)


def test_named_interfaces_hold_every_listener_of_a_multi_host_job():
    library = "/pkg/libtfring_loopback_listeners.so"
    argv = ["-np", "4", "-H", "a:2,b:2", "--network-interface",
            "eth1,10.1.0.0/16", "p"]
    cmd = launch_command.mpirun_command(
        runner.parse_args(argv), "/opt/mpi/bin/mpirun",
        {"LD_PRELOAD": "/opt/libjemalloc.so"}, 1000, 8, library)
    preload = f"{library}:/opt/libjemalloc.so"
    # The daemons on the other hosts start with it ...
    assert _contains(cmd, [
        "--prtemca", "prte_launch_agent",
        f"env LD_PRELOAD={preload} TFRING_LISTEN_ON=eth1,10.1.0.0/16 "
        "/opt/mpi/bin/prted"])
    # ... and so do the ranks (it acts only on Open MPI's own binds there).
    assert _contains(cmd, ["-x", f"LD_PRELOAD={preload}"])
    assert _contains(cmd, ["-x", "TFRING_LISTEN_ON=eth1,10.1.0.0/16"])
    assert cmd[-1] == "p"
    # Without named interfaces, one host, or the library: nothing of it.
    for other, lib in ((["-np", "4", "-H", "a:2,b:2", "p"], library),
                       (["-np", "4", "--network-interface", "eth1", "p"],
                        library),
                       (argv, None)):
        cmd = launch_command.mpirun_command(
            runner.parse_args(other), "/opt/mpi/bin/mpirun", {}, 1000, 8, lib)
        assert "prte_launch_agent" not in cmd
        assert not any(word.startswith(("LD_PRELOAD", "TFRING_LISTEN_ON"))
                       for word in cmd)


def _agent(cmd):
    return cmd[cmd.index("prte_launch_agent") + 1]


MULTI_HOST_ON_ETH1 = ["-np", "4", "-H", "a:2,b:2", "--network-interface",
                      "eth1", "p"]


@pytest.mark.parametrize("mpirun, environ, words", [
    # A path with spaces: one quoted word, which PRRTE keeps (it cuts the
    # agent at single spaces and joins the pieces again with one).
    ("/opt/my mpi/bin/mpirun", {},
     ["env", "LD_PRELOAD=/pkg/libtfring_loopback_listeners.so",
      "TFRING_LISTEN_ON=eth1", "/opt/my mpi/bin/prted"]),
    # Shell metacharacters in a path are quoted too.
    ("/opt/$(x);y/bin/mpirun", {},
     ["env", "LD_PRELOAD=/pkg/libtfring_loopback_listeners.so",
      "TFRING_LISTEN_ON=eth1", "/opt/$(x);y/bin/prted"]),
    # The user's preloads, separated by spaces (as the loader allows), are
    # joined by colons: the restriction is kept.
    ("/opt/mpi/bin/mpirun", {"LD_PRELOAD": " /opt/a.so /opt/b.so:/c.so "},
     ["env", "LD_PRELOAD=/pkg/libtfring_loopback_listeners.so:/opt/a.so:"
             "/opt/b.so:/c.so",
      "TFRING_LISTEN_ON=eth1", "/opt/mpi/bin/prted"]),
])
def test_every_word_of_the_launch_agent_is_quoted(mpirun, environ, words):
    library = "/pkg/libtfring_loopback_listeners.so"
    cmd = launch_command.mpirun_command(
        runner.parse_args(MULTI_HOST_ON_ETH1), mpirun, environ, 1000, 8,
        library)
    agent = _agent(cmd)
    # PRRTE cuts the agent at spaces and joins the words again with one;
    # the other host's shell then reads it (here: sh prints the words).
    joined = " ".join(word for word in agent.split(" ") if word)
    printed = subprocess.run(["sh", "-c", "printf '%s\\n' " + joined],
                             capture_output=True, text=True, timeout=60)
    assert printed.stdout.splitlines() == words, printed.stderr
    assert _contains(cmd, ["-x", words[1]])
    assert _contains(cmd, ["-x", "TFRING_LISTEN_ON=eth1"])


def test_a_daemon_path_prrte_cannot_keep_is_refused():
    with pytest.raises(launch_command.RunnerError) as e:
        launch_command.mpirun_command(
            runner.parse_args(MULTI_HOST_ON_ETH1), "/opt/my  mpi/bin/mpirun",
            {}, 1000, 8, "/pkg/libtfring_loopback_listeners.so")
    assert str(e.value).startswith(
        "mpirun is at '/opt/my  mpi/bin/mpirun': tfringrun starts the "
        "daemons on the other hosts as '/opt/my  mpi/bin/prted', through "
        "PRRTE's launch agent, which cuts its command line at spaces and "
        "cannot keep a path with several spaces in a row, tabs or newlines. "
        "Expected a path without them, or the daemons would listen on every "
        "address despite --network-interface.")


def _refused_library(library, where):
    return (f"tfring is installed at {os.path.dirname(library)!r}, a path "
            f"with whitespace or ':'. tfringrun preloads "
            f"libtfring_loopback_listeners.so from there into mpirun to keep "
            f"its listeners {where}, and LD_PRELOAD cannot name a file whose "
            f"path has whitespace or ':' (the loader splits the list there). "
            f"Expected an installation path without them: install tfring "
            f"(its Python environment) under such a path.")


@pytest.mark.parametrize("library", [
    "/my pkgs/tfring/launcher/libtfring_loopback_listeners.so",
    "/pkgs:x/tfring/launcher/libtfring_loopback_listeners.so"])
def test_a_library_ld_preload_cannot_name_is_refused(library):
    # The loader splits LD_PRELOAD at spaces and colons: the library would
    # not load, and the listeners would bind to every address.
    one_host = runner.parse_args(["-np", "2", "p"])
    with pytest.raises(launch_command.RunnerError) as e:
        launch_command.launcher_environment(one_host, {}, library)
    assert str(e.value) == _refused_library(library, "on loopback")
    several = runner.parse_args(MULTI_HOST_ON_ETH1)
    where = "on the --network-interface addresses"
    with pytest.raises(launch_command.RunnerError) as e:
        launch_command.launcher_environment(several, {}, library)
    assert str(e.value) == _refused_library(library, where)
    with pytest.raises(launch_command.RunnerError) as e:
        launch_command.mpirun_command(several, "/opt/mpi/bin/mpirun", {},
                                      1000, 8, library)
    assert str(e.value) == _refused_library(library, where)


@pytest.mark.parametrize("argv", [
    ["-np", "2", "p"], ["-np", "2", "-H", "gpu7:2", "p"],
    ["-np", "4", "-H", "a:2,b:2", "p"]])
def test_ranks_get_no_preload_of_tfrings(argv):
    # tfringrun replaces no allocator and preloads nothing into the ranks:
    # only the user's own LD_PRELOAD (jemalloc, say) reaches them, through
    # the environment they inherit.
    cmd = launch_command.mpirun_command(
        runner.parse_args(argv), "/opt/mpi/bin/mpirun",
        {"LD_PRELOAD": "/opt/libjemalloc.so"}, 1000, 8,
        "/pkg/libtfring_loopback_listeners.so")
    assert not any(word.startswith("LD_PRELOAD") for word in cmd), cmd
    assert cmd[-1] == "p"


def test_network_interface_restricts_open_mpi_and_prrte():
    cmd = command(["-np", "4", "-H", "a:2,b:2", "--network-interface", "eth0",
                   "--network-interface", "ib0,10.1.0.0/16", "p"])
    assert _contains(cmd, ["--mca", "btl_tcp_if_include",
                           "eth0,ib0,10.1.0.0/16"])
    assert _contains(cmd, ["--prtemca", "prte_if_include",
                           "eth0,ib0,10.1.0.0/16"])
    assert not _contains(cmd, ONE_HOST)
    # Horovod's plural spelling means the same.
    assert command(["-np", "4", "-H", "a:2,b:2", "--network-interfaces",
                    "eth0,eth1", "p"]) == command(
        ["-np", "4", "-H", "a:2,b:2", "--network-interface", "eth0,eth1",
         "p"])
    assert "btl_tcp_if_include" not in command(["-np", "4", "-H", "a:2,b:2",
                                                "p"])


def test_bad_network_interface_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["-np", "2", "--network-interface", "eth0,,ib0",
                           "p"])
    err = capsys.readouterr().err
    assert "got 'eth0,,ib0': an empty name; expected interface names (or " \
           "subnets) separated by commas" in err


@pytest.mark.parametrize("value, bad", [
    # What reached the other hosts' shell unquoted before.
    ("eth0,x;touch${IFS}/tmp/p", "x;touch${IFS}/tmp/p"),
    ("eth0 x", "eth0 x"),
    ("$(reboot)", "$(reboot)"),
    ("eth0,`id`", "`id`"),
    ("a-name-too-long-0", "a-name-too-long-0"),  # Linux: 15 bytes at most
    ("10.1.0.0/33", "10.1.0.0/33"),
    ("10.1.2.300", "10.1.2.300"),
])
def test_network_interfaces_must_be_names_or_subnets(value, bad, capsys):
    with pytest.raises(SystemExit) as e:
        runner.parse_args(["-np", "2", "--network-interface", value, "p"])
    assert e.value.code == 2
    assert (f"got {value!r}: {bad!r} is neither an interface name (at most "
            f"15 letters, digits, '.', '_', '-' or ':') nor an IP address or "
            f"subnet (such as 10.1.0.0/16); expected interface names (or "
            f"subnets) separated by commas") in capsys.readouterr().err


@pytest.mark.parametrize("value", [
    "eth0", "enp0s31f6", "ib0", "br-1a2b3c4d5e6f", "eth0.100", "eth0:1",
    "veth_9", "10.1.0.0/16", "10.1.2.3", "fd00::/64", "fe80::1"])
def test_interface_names_and_subnets_are_taken(value):
    args = runner.parse_args(["-np", "2", "--network-interface", value, "p"])
    assert args.network_interfaces == [value]


def test_output_filename_writes_per_rank_files_into_the_directory(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = command(["-np", "2", "--output-filename", "logs", "p"])
    assert _contains(cmd, ["--output", f"file={tmp_path}/logs/rank"])


@pytest.mark.parametrize("text, message", [
    ("a:x", "-H a:x: the entry 'a:x' gives 'x' slots. Expected a positive "
            "whole number of slots"),
    ("a:0,b:1", "gives '0' slots"),
    (":2", "the entry ':2' has no host name"),
    (",", "names no host"),
])
def test_bad_host_lists_are_usage_errors(text, message, capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["-np", "2", "-H", text, "p"])
    assert message in capsys.readouterr().err


def test_hostfiles_are_read_with_comments_and_slots(tmp_path):
    path = _hostfile(tmp_path, "# cluster\n\nnode1 slots=2  # gpu\n"
                               "node2 slots=4 max_slots=8\nnode3\n")
    assert launch_hosts.read_hostfile(path) == [
        launch_hosts.Host("node1", 2), launch_hosts.Host("node2", 4),
        launch_hosts.Host("node3", None)]


@pytest.mark.parametrize("text, message", [
    (None, "cannot read the hostfile"),
    ("# nothing\n", "names no host"),
    ("slots=2\n", ":1: the line 'slots=2' starts with 'slots=2', not a host "
                   "name"),
    ("a slots=many\n", ":1 gives 'many' slots"),
])
def test_bad_hostfiles_are_usage_errors(text, message, tmp_path, capsys):
    path = tmp_path / "hosts"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit):
        runner.parse_args(["-np", "2", "--hostfile", str(path), "p"])
    assert message in capsys.readouterr().err


# --- TFRING_* flags ----------------------------------------------------------

def _forwarded(cmd):
    return [cmd[i + 1] for i, word in enumerate(cmd) if word == "-x"]


@pytest.mark.parametrize("flags, variable", [
    (["--fusion-threshold-mb", "64"], "TFRING_FUSION_THRESHOLD=67108864"),
    (["--fusion-threshold-mb", "0"], "TFRING_FUSION_THRESHOLD=0"),
    (["--cycle-time-ms", "2.5"], "TFRING_CYCLE_TIME=2.5"),
    (["--cycle-time-ms", "3"], "TFRING_CYCLE_TIME=3"),
    (["--cache-capacity", "0"], "TFRING_CACHE_CAPACITY=0"),
    (["--disable-cache"], "TFRING_CACHE_CAPACITY=0"),
    (["--direct-threshold-mb", "0.5"], "TFRING_DIRECT_THRESHOLD=524288"),
    (["--no-shm"], "TFRING_SHM=0"),
    (["--shm-bytes", "1048576"], "TFRING_SHM_BYTES=1048576"),
    (["--shm-timeout-seconds", "5"], "TFRING_SHM_TIMEOUT_SECONDS=5"),
    (["--output-pool-bytes", "0"], "TFRING_OUTPUT_POOL_BYTES=0"),
    (["--no-stall-check"], "TFRING_STALL_CHECK_TIME_SECONDS=0"),
    (["--stall-check-warning-time-seconds", "120"],
     "TFRING_STALL_CHECK_TIME_SECONDS=120"),
    (["--stall-check-shutdown-time-seconds", "600"],
     "TFRING_STALL_SHUTDOWN_TIME_SECONDS=600"),
    (["--log-level", "DEBUG"], "TFRING_LOG_LEVEL=debug"),
    (["--timeline-filename", "/tmp/t.json"], "TFRING_TIMELINE=/tmp/t.json"),
    (["--timeline-mark-cycles"], "TFRING_TIMELINE_MARK_CYCLES=1"),
    (["--autotune"], "TFRING_AUTOTUNE=1"),
    (["--autotune-log-file", "/tmp/tune.csv"],
     "TFRING_AUTOTUNE_LOG=/tmp/tune.csv"),
    (["--autotune-start", "fusion_threshold=65536,cycle_time=1"],
     "TFRING_AUTOTUNE_START=fusion_threshold=65536,cycle_time=1"),
    (["--autotune-warmup-samples", "5"], "TFRING_AUTOTUNE_WARMUP_SAMPLES=5"),
    (["--autotune-steps-per-sample", "20"],
     "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE=20"),
    (["--autotune-cycles-per-sample", "20"],
     "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE=20"),
    (["--autotune-samples-per-trial", "4"],
     "TFRING_AUTOTUNE_SAMPLES_PER_TRIAL=4"),
    (["--autotune-bayes-opt-max-samples", "30"],
     "TFRING_AUTOTUNE_MAX_TRIALS=30"),
    (["--autotune-max-trials", "30"], "TFRING_AUTOTUNE_MAX_TRIALS=30"),
    (["--autotune-gaussian-process-noise", "0.8"],
     "TFRING_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=0.8"),
])
def test_flags_set_tfring_variables_for_every_rank(flags, variable):
    cmd = command(["-np", "2"] + flags + ["python", "t.py"])
    assert _forwarded(cmd) == [variable]
    assert cmd[-2:] == ["python", "t.py"]


def test_every_knob_of_the_core_has_a_flag():
    declared = {entry["env"] for entry in _core.config()}
    with_flags = {knob.env for knob in launch_knobs.KNOB_FLAGS}
    assert declared == with_flags


def _help_of_each_flag():
    """{first option string: its help text as `tfringrun --help` shows it}."""
    parser = runner._parser()
    parser.format_help()  # as `tfringrun --help` does: the defaults
    formatter = parser._get_formatter()
    return {action.option_strings[0]: formatter._expand_help(action)
            for action in parser._actions
            if action.option_strings and action.help}


def test_help_shows_the_cores_defaults():
    defaults = {entry["env"]: entry["default"] for entry in _core.config()}
    helps = _help_of_each_flag()
    assert "(default 1800)" in helps["--stall-check-shutdown-time-seconds"]
    assert defaults["TFRING_STALL_SHUTDOWN_TIME_SECONDS"] == "1800"
    shown = 0
    for knob in launch_knobs.KNOB_FLAGS:
        text = helps[knob.flags[0]]
        match = re.search(r"\(default ([^)]+)\)", text)
        core = defaults[knob.env]
        if knob.kind is None or core == "":
            assert match is None, (knob.flags[0], text)
            continue
        assert match, (knob.flags[0], text)
        value = match.group(1)
        # Back in the core's unit, the shown default is the core's.
        if knob.kind is launch_knobs.MIB:
            assert float(value) * 1024 * 1024 == float(core), knob.flags[0]
        elif knob.choices:
            assert knob.choices.index(value) == int(core)
        else:
            assert float(value) == float(core), (knob.flags[0], value, core)
        shown += 1
    assert shown >= 15


def test_the_generated_flag_table_shows_the_cores_defaults():
    sys.path.insert(0, os.path.join(REPO, "docs", "hooks"))
    try:
        import generated
    finally:
        sys.path.pop(0)
    [row] = [line for line in generated.tfringrun_flags().splitlines()
             if line.startswith("| `--stall-check-shutdown-time-seconds")]
    assert "0 never (default 1800)" in row, row


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = command(["-np", "2", "--timeline-filename", "t.json",
                   "--autotune-log-file", "out/tune.csv", "p"])
    assert _forwarded(cmd) == [f"TFRING_AUTOTUNE_LOG={tmp_path}/out/tune.csv",
                               f"TFRING_TIMELINE={tmp_path}/t.json"]


def test_a_flag_overrides_the_environment_once():
    environ = {"TFRING_CYCLE_TIME": "5", "TFRING_CACHE_CAPACITY": "0",
               "PYTHONPATH": "/src"}
    cmd = command(["-np", "2", "--cycle-time-ms", "2", "p"], environ=environ)
    assert _forwarded(cmd) == ["PYTHONPATH", "TFRING_CACHE_CAPACITY",
                               "TFRING_CYCLE_TIME=2"]


def test_two_flags_for_one_variable_are_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["-np", "2", "--no-stall-check",
                           "--stall-check-warning-time-seconds", "30", "p"])
    assert ("--no-stall-check and --stall-check-warning-time-seconds both "
            "set TFRING_STALL_CHECK_TIME_SECONDS. Expected at most one of "
            "them.") in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--fusion-threshold-mb", "-1"],
     "argument --fusion-threshold-mb: got '-1'; expected a non-negative "
     "number of MiB, e.g. --fusion-threshold-mb 64"),
    (["--cycle-time-ms", "fast"],
     "got 'fast'; expected a non-negative number of milliseconds"),
    (["--cache-capacity", "1.5"],
     "got '1.5'; expected a whole number of items, e.g. --cache-capacity 3"),
    (["--shm-bytes", "nan"], "got 'nan'; expected a non-negative number"),
    (["--log-level", "fatal"], "invalid choice: 'fatal'"),
])
def test_bad_flag_values_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        runner.parse_args(["-np", "2"] + flags + ["p"])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def _executable(path):
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(path, 0o755)
    return str(path)


def test_find_mpirun_order(tmp_path):
    find_mpirun = launch_command.find_mpirun
    venv_bin = tmp_path / "venv" / "bin"
    path_bin = tmp_path / "path"
    venv_bin.mkdir(parents=True)
    path_bin.mkdir()
    python = str(venv_bin / "python")
    on_path = _executable(path_bin / "mpirun")
    environ = {"PATH": str(path_bin)}
    assert find_mpirun(environ, python) == on_path
    beside = _executable(venv_bin / "mpirun")
    assert find_mpirun(environ, python) == beside
    chosen = _executable(tmp_path / "my-mpirun")
    environ["TFRING_MPIRUN"] = chosen
    assert find_mpirun(environ, python) == chosen


def test_missing_mpirun_says_how_to_fix(tmp_path):
    python = str(tmp_path / "python")
    with pytest.raises(launch_command.RunnerError,
                       match="TFRING_MPIRUN=/path/to/mpirun"):
        launch_command.find_mpirun({"PATH": str(tmp_path)}, python)
    with pytest.raises(launch_command.RunnerError,
                       match="'/no/such/mpirun'.*not an"):
        launch_command.find_mpirun({"TFRING_MPIRUN": "/no/such/mpirun"},
                                   python)


def _run(argv, env, timeout=300, cwd=None):
    """Runs argv in its own process group; kills the group on timeout."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} ran past {timeout} s\nstdout:\n{out}\n"
                    f"stderr:\n{err}")
    return proc.returncode, out, err


def test_missing_mpirun_exits_with_the_message(tmp_path):
    rc, _, err = _run([sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
                       "true"],
                      mpi_launch.working_tree_env(
                          TFRING_MPIRUN=str(tmp_path / "nope")))
    assert rc == 127
    assert "tfringrun: error: TFRING_MPIRUN is set to" in err


def test_real_two_rank_run():
    pytest.importorskip("mpi4py")
    script = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
              "print(f'rank {c.Get_rank()} of {c.Get_size()}', flush=True)")
    rc, out, err = _run(
        [sys.executable, "-m", "tfring.launcher.cli", "--verbose", "-np", "2",
         sys.executable, "-c", script],
        mpi_launch.working_tree_env(TFRING_TEST_MARK="1"))
    assert rc == 0, err
    ranks = sorted(line for line in out.splitlines()
                   if line.startswith("rank "))
    assert ranks == ["rank 0 of 2", "rank 1 of 2"]
    assert "-x TFRING_TEST_MARK" in err  # the --verbose echo of the command


_FORK_SNAPSHOT = """
import os
import numpy as np
a = np.ones(1 << 22)
b = np.ones(1 << 22)
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:  # the child checks once the parent has changed its own copies
    os.read(ready_r, 1)
    exact = bool(np.all(a == 1) and np.all(b == 1))
    os._exit(0 if exact else 7)
a[:] = 2
del b
c = np.full(1 << 22, 3.0)
os.write(ready_w, b"x")
_, status = os.waitpid(pid, 0)
print(os.environ["OMPI_COMM_WORLD_RANK"], os.environ.get("LD_PRELOAD"),
      "snapshot" if os.waitstatus_to_exitcode(status) == 0 else "CHANGED",
      flush=True)
"""


def test_one_host_ranks_keep_their_allocator_and_fork_snapshots():
    # The ranks of a real one-host job run with the user's LD_PRELOAD and
    # nothing else, and a child forked by a rank (multiprocessing, a data
    # loader) sees the parent's memory as it was at fork(), whatever the
    # parent writes, frees or allocates afterwards.
    libm = "/lib/x86_64-linux-gnu/libm.so.6"
    if not os.path.isfile(libm):
        pytest.skip(f"{libm} (a harmless library to preload) is not here")
    rc, out, err = _run(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
         sys.executable, "-c", _FORK_SNAPSHOT],
        mpi_launch.working_tree_env(LD_PRELOAD=libm))
    assert rc == 0, err
    assert sorted(out.split("\n")[:-1]) == [
        f"0 {libm} snapshot", f"1 {libm} snapshot"], out + err


def test_exit_status_passes_through():
    rc, _, _ = _run([sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
                     sys.executable, "-c", "raise SystemExit(3)"],
                    mpi_launch.working_tree_env())
    assert rc == 3


_PRINT_RANK_ENV = (
    "import os; r = os.environ['OMPI_COMM_WORLD_RANK']; "
    "print(r, os.environ.get('TFRING_TIMELINE'), "
    "os.environ.get('TFRING_FUSION_THRESHOLD'), "
    "os.environ.get('TFRING_CYCLE_TIME'), flush=True)")


def test_flags_reach_every_rank(tmp_path):
    rc, out, err = _run(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
         "--timeline-filename", "t.json", "--fusion-threshold-mb", "1",
         sys.executable, "-c", _PRINT_RANK_ENV],
        mpi_launch.working_tree_env(TFRING_CYCLE_TIME="7"), cwd=tmp_path)
    assert rc == 0, err
    timeline = str(tmp_path / "t.json")
    assert sorted(out.split("\n")[:-1]) == [
        f"0 {timeline} 1048576 7", f"1 {timeline} 1048576 7"]


def test_output_filename_writes_each_ranks_output_to_files(tmp_path):
    script = ("import os, sys; r = os.environ['OMPI_COMM_WORLD_RANK']; "
              "print('out of', r); print('err of', r, file=sys.stderr)")
    logs = tmp_path / "logs" / "run1"
    rc, out, err = _run(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
         "--output-filename", str(logs), sys.executable, "-c", script],
        mpi_launch.working_tree_env())
    assert rc == 0, err
    assert "out of" not in out and "err of" not in err
    files = sorted(os.listdir(logs))
    assert [name.rsplit(".", 2)[1:] for name in files] == [
        ["0", "err"], ["0", "out"], ["1", "err"], ["1", "out"]], files
    assert all(name.startswith("rank.") for name in files)
    for name in files:
        rank, stream = name.rsplit(".", 2)[1:]
        expected = ("out of " if stream == "out" else "err of ") + rank
        assert (logs / name).read_text().strip() == expected


def test_output_filename_that_cannot_be_a_directory_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, _, err = _run([sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
                       "--output-filename", str(blocker / "logs"), "true"],
                      mpi_launch.working_tree_env())
    assert rc == 1
    assert (f"tfringrun: error: --output-filename {blocker}/logs: cannot "
            f"create the directory (Not a directory). Expected a directory "
            f"tfringrun can create or write to.") in err


def test_a_python_script_given_without_python_runs(tmp_path):
    # Not executable, no `python` before it: Open MPI alone would be
    # "unable to find the specified executable".
    script = tmp_path / "train.py"
    script.write_text("import os, sys\n"
                      "print('rank', os.environ['OMPI_COMM_WORLD_RANK'], "
                      "sys.executable == sys.argv[1], flush=True)\n")
    rc, out, err = _run(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2", "train.py",
         sys.executable], mpi_launch.working_tree_env(), cwd=tmp_path)
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["rank 0 True", "rank 1 True"], out


def _output_directory_error(logs):
    return _run([sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
                 "--output-filename", str(logs), sys.executable, "-c",
                 "import sys; print('out'); print('err', file=sys.stderr)"],
                mpi_launch.working_tree_env())


@pytest.mark.parametrize("mode, writers", [
    (0o777, "its group and every user"), (0o770, "its group"),
    (0o703, "every user")])
def test_output_filename_refuses_a_directory_others_can_write(
        tmp_path, mode, writers):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(mode)
    rc, _, err = _output_directory_error(logs)
    assert rc == 1
    assert (f"tfringrun: error: --output-filename {logs}: the directory is "
            f"writable by {writers} (mode {mode:04o}) without the sticky "
            f"bit, so another user could replace the ranks' output files "
            f"with links to other files, which the job would then write. "
            f"Expected a directory only you (or root) can write to, or one "
            f"with the sticky bit. Run `chmod go-w {logs}` or choose another "
            f"directory.") in err
    assert os.listdir(logs) == []


def test_output_filename_takes_a_sticky_directory(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o1777)  # as /tmp
    rc, _, err = _output_directory_error(logs)
    assert rc == 0, err
    assert sorted(name.rsplit(".", 1)[1] for name in os.listdir(logs)) == [
        "err", "err", "out", "out"]


@pytest.fixture
def other_user():
    """A second local user (made here, removed afterwards): its name and
    uid. Needs root and useradd."""
    if os.geteuid() != 0:
        pytest.skip("making a second local user needs root")
    if not shutil.which("useradd") or not shutil.which("userdel"):
        pytest.skip("needs useradd and userdel")
    name = f"tfrt{os.getpid() % 100000}"
    made = subprocess.run(["useradd", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", name],
                          capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        yield name, pwd.getpwnam(name).pw_uid
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


def test_output_filename_refuses_another_users_directory(tmp_path,
                                                        other_user):
    # A directory of the other user's, mode 0755: only its owner can write
    # there, and so can root, which runs this test. The owner could put a
    # link named as a rank's output file there.
    name, uid = other_user
    logs = tmp_path / "theirs"
    logs.mkdir(mode=0o755)
    os.chown(logs, uid, uid)
    planted = tmp_path / "precious"
    planted.write_text("keep me\n")
    rc, _, err = _output_directory_error(logs)
    assert rc == 1
    assert (f"tfringrun: error: --output-filename {logs}: the directory "
            f"belongs to {name} (uid {uid}), not to you (root (uid 0)) or "
            f"root; its owner could replace the ranks' output files with "
            f"links to other files, which the job would then write. "
            f"Expected a directory of your own. Choose one, e.g. "
            f"--output-filename ~/tfring-logs.") in err
    assert os.listdir(logs) == []
    assert planted.read_text() == "keep me\n"


# --- stopping a job ----------------------------------------------------------

_WAITS = ("import os, time; "
          "print('ready', os.environ['OMPI_COMM_WORLD_RANK'], flush=True); "
          "time.sleep(300)")


def _started_job(tag):
    """tfringrun running 2 ranks that wait, in a session of its own (as a
    terminal's foreground job is a process group of its own), once both
    ranks have said they are ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
         sys.executable, "-c", _WAITS],
        env=mpi_launch.working_tree_env(**{mpi_launch.TAG_VARIABLE: tag}),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    ready = [proc.stdout.readline() for _ in range(2)]
    assert sorted(ready) == ["ready 0\n", "ready 1\n"], ready
    return proc


@pytest.mark.parametrize("signum, to_group, status, name", [
    # Ctrl-C: the terminal signals the whole foreground process group.
    (signal.SIGINT, True, 130, "SIGINT (Ctrl-C)"),
    # `kill -INT PID`: tfringrun alone; it passes the signal on.
    (signal.SIGINT, False, 130, "SIGINT (Ctrl-C)"),
    (signal.SIGTERM, False, 143, "SIGTERM"),
])
def test_a_signal_stops_every_rank_and_is_reported(signum, to_group, status,
                                                   name):
    tag = f"stop-{os.getpid()}-{signum}-{to_group}"
    proc = _started_job(tag)
    try:
        start = time.monotonic()
        (os.killpg if to_group else os.kill)(proc.pid, signum)
        out, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        mpi_launch._kill_tagged(tag)
    assert proc.returncode == status, err
    assert (f"tfringrun: the job was stopped by {name}; mpirun ended every "
            f"rank. Exit status {status}.") in err
    # One signal reached mpirun: it did not ask for another Ctrl-C.
    assert "Abort is in progress" not in out + err
    assert seconds < (15 if to_group else 25), seconds
    assert not mpi_launch._tagged_pids(tag)  # no rank left


def test_sigusr1_sent_to_tfringrun_reaches_every_rank():
    # As when tfringrun exec'd mpirun: mpirun passes SIGUSR1 to the ranks.
    script = ("import os, signal, sys, time\n"
              "got = []\n"
              "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
              "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
              "print('ready', rank, flush=True)\n"
              "deadline = time.monotonic() + 60\n"
              "while not got and time.monotonic() < deadline:\n"
              "    time.sleep(0.05)\n"
              "print('usr1' if got else 'none', flush=True)\n")
    tag = f"usr1-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
         sys.executable, "-c", script],
        env=mpi_launch.working_tree_env(**{mpi_launch.TAG_VARIABLE: tag}),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready = [proc.stdout.readline() for _ in range(2)]
        assert sorted(ready) == ["ready 0\n", "ready 1\n"], ready
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        mpi_launch._kill_tagged(tag)
    assert proc.returncode == 0, err
    assert out.split() == ["usr1", "usr1"], out + err
