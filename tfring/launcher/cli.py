# tfringrun: start a tfring job with mpirun, or check that one can start.
#
# Why it exists: the command-line front of the launcher. It parses the
# arguments, runs the checks the user asked for (tfring/launcher/checks.py),
# then builds the mpirun command (tfring/launcher/command.py) and runs it
# (tfring/launcher/supervise.py), passing mpirun's exit status on and saying
# when a signal (Ctrl-C) stopped the job or Open MPI's runtime ended it on
# losing a host's daemon; an elastic job is then started again on the other
# hosts (tfring/launcher/restart.py).
#
#   tfringrun -np 4 python train.py
#   tfringrun -np 4 -H node1:2,node2:2 --verbose -- python train.py --epochs 3
#   tfringrun --check-build
#   tfringrun --check-hosts -H node1:2,node2:2

import argparse
import os
import pwd
import shlex
import stat
import sys

from tfring.launcher import checks as launch_checks
from tfring.launcher import command as launch_command
from tfring.launcher import daemon_loss
from tfring.launcher import elastic as launch_elastic
from tfring.launcher import hosts as launch_hosts
from tfring.launcher import knobs as launch_knobs
from tfring.launcher import restart as launch_restart
from tfring.launcher import supervise as launch_supervise
from tfring.launcher.command import RunnerError

# Seconds each check's mpirun may run (a job's start needs TensorFlow to
# import on every rank, which takes a while on a busy machine).
DEFAULT_START_TIMEOUT = 120


def _num_proc(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; expected a positive whole number of processes, "
            f"e.g. `-np 2`")
    return value


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"got {text!r}; expected a positive number of seconds, e.g. "
            f"`--start-timeout 60`")
    return value


def _interfaces(text):
    names = [name.strip() for name in text.split(",")]
    problems = [launch_command.interface_problem(name)
                for name in names if name]
    if not all(names) or any(problems):
        reason = next((p for p in problems if p), "an empty name")
        raise argparse.ArgumentTypeError(
            f"got {text!r}: {reason}; expected interface names (or subnets) "
            f"separated by commas, e.g. `--network-interface eth0` or "
            f"`--network-interface eth0,10.1.0.0/16`")
    return names


class _ExactOptionParser(argparse.ArgumentParser):
    """An argument parser that takes options only as spelled in full, and
    shows the core's defaults in its help.

    allow_abbrev=False turns off abbreviations of `--long` options only;
    a single-dash prefix (`-n` for `-np`) would still be taken. tfringrun
    passes everything after the program on to it, so a misspelt option of
    tfringrun's must be an error, not a guess."""

    def format_help(self):
        # The knobs' defaults come from the core, loaded only for the help.
        launch_knobs.show_defaults(self)
        return super().format_help()

    def _get_option_tuples(self, option_string):
        # Keep an option followed by its value in the same word (`-H
        # node1:2` as `-Hnode1:2`); drop the prefixes of longer options.
        return [found for found in super()._get_option_tuples(option_string)
                if option_string.startswith(found[1])]


def _parser():
    parser = _ExactOptionParser(
        prog="tfringrun", allow_abbrev=False,
        description="Run a tfring training script on N processes with "
                    "mpirun, or check that this machine and the hosts can.",
        epilog="examples: tfringrun -np 2 python train.py --steps 10; "
               "tfringrun --check-build; "
               "tfringrun --check-hosts -H node1:2,node2:2")
    parser.add_argument(
        "-np", "--num-proc", dest="num_proc", type=_num_proc, default=None,
        help="number of processes (ranks) to start")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument(
        "-H", "--hosts", default=None,
        help="comma-separated host:slots list, e.g. node1:2,node2:2 "
             "(default: this machine only)")
    hosts.add_argument(
        "--hostfile", default=None,
        help="an mpirun hostfile, one `host slots=N` per line")
    parser.add_argument(
        "--network-interface", "--network-interfaces",
        dest="network_interfaces", type=_interfaces, action="extend",
        default=None, metavar="IFACE[,IFACE]",
        help="network interfaces (or subnets) the job's MPI and launcher "
             "traffic uses between hosts (Open MPI btl_tcp_if_include, "
             "PRRTE prte_if_include); may be repeated")
    parser.add_argument(
        "--output-filename", default=None, metavar="DIR",
        help="write each rank's output to DIR/rank.<job id>.<rank>.out and "
             ".err instead of the terminal")
    parser.add_argument(
        "-cb", "--check-build", action="store_true",
        help="print what tfring was built with and run a 2-rank allreduce "
             "here; exit non-zero if anything does not work")
    parser.add_argument(
        "--check-hosts", action="store_true",
        help="check that every host of -H/--hostfile is reachable through "
             "mpirun and has this machine's Python, TensorFlow and tfring")
    parser.add_argument(
        "--start-timeout", type=_seconds, default=DEFAULT_START_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit of each check's mpirun run (default "
             f"{DEFAULT_START_TIMEOUT})")
    parser.add_argument(
        "--verbose", action="store_true",
        help="print the mpirun command before running it")
    launch_knobs.add_arguments(parser)
    launch_elastic.add_arguments(parser)
    parser.add_argument(
        "command", nargs=argparse.REMAINDER,
        help="the program and its arguments (put `--` before it if it "
             "starts with a dash; a program named *.py runs with the Python "
             "running tfringrun); optional with --check-build or "
             "--check-hosts, which then run before it")
    return parser


def parse_args(argv):
    """Parses tfringrun's arguments (without the program name).

    Also reads the host list (`args.host_entries`, empty for this machine)
    and checks the TFRING_* flags against each other."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(
            f"unknown option {' '.join(unknown)}. Expected tfringrun's "
            f"options spelled in full, as `tfringrun --help` lists them "
            f"(`-np 2`, not `-n 2`); the program's own options go after the "
            f"program.")
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    args.command = launch_command.program_command(args.command,
                                                  sys.executable)
    checking = args.check_build or args.check_hosts
    if not args.command and not checking:
        parser.error("no command given; expected the program to run on every "
                     "rank, e.g. `tfringrun -np 2 python train.py`")
    if args.command and args.num_proc is None:
        parser.error("-np/--num-proc is required to run a command; expected "
                     "the number of processes, e.g. "
                     "`tfringrun -np 2 python train.py`")
    try:
        if args.hosts is not None:
            args.host_entries = launch_hosts.parse_host_list(args.hosts)
        elif args.hostfile is not None:
            args.host_entries = launch_hosts.read_hostfile(args.hostfile)
        else:
            args.host_entries = []
        launch_knobs.settings(args)
        launch_elastic.check(args)
        if launch_elastic.enabled(args):
            launch_elastic.choose_commit_directory(args, os.environ)
    except ValueError as e:
        parser.error(str(e))
    if args.check_hosts and not args.host_entries:
        parser.error("--check-hosts needs the hosts to check; expected "
                     "-H host1:2,host2:2 or --hostfile FILE")
    if args.output_filename is not None:
        args.output_filename = os.path.abspath(args.output_filename)
    return args


def _user(uid):
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _prepare_output_directory(path, euid):
    """Creates the --output-filename directory if needed, and refuses one
    that another user could put files or links into: Open MPI names the
    output files predictably (rank.<job id>.<rank>.out) and opens them
    following links, so such a user could make the job write its output
    into any file the job may write."""
    try:
        os.makedirs(path, exist_ok=True)
        found = os.stat(path)
    except OSError as e:
        raise RunnerError(
            f"--output-filename {path}: cannot create the directory "
            f"({e.strerror}). Expected a directory tfringrun can create or "
            f"write to. Choose another path or fix its permissions.") from e
    if found.st_uid not in (euid, 0):
        raise RunnerError(
            f"--output-filename {path}: the directory belongs to "
            f"{_user(found.st_uid)}, not to you ({_user(euid)}) or root; "
            f"its owner could replace the ranks' output files with links "
            f"to other files, which the job would then write. Expected a "
            f"directory of your own. Choose one, e.g. "
            f"--output-filename ~/tfring-logs.")
    writers = [who for who, bit in (("its group", stat.S_IWGRP),
                                    ("every user", stat.S_IWOTH))
               if found.st_mode & bit]
    if writers and not found.st_mode & stat.S_ISVTX:
        raise RunnerError(
            f"--output-filename {path}: the directory is writable by "
            f"{' and '.join(writers)} (mode "
            f"{stat.S_IMODE(found.st_mode):04o}) without the sticky bit, so "
            f"another user could replace the ranks' output files with links "
            f"to other files, which the job would then write. Expected a "
            f"directory only you (or root) can write to, or one with the "
            f"sticky bit. Run `chmod go-w {shlex.quote(path)}` or choose "
            f"another directory.")
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunnerError(
            f"--output-filename {path}: the directory is not writable. "
            f"Expected a directory the ranks can write their output to. "
            f"Choose another path or fix its permissions.")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        mpirun = launch_command.find_mpirun(os.environ, sys.executable)
    except RunnerError as e:
        print(f"tfringrun: error: {e}", file=sys.stderr)
        return 127
    facts = (mpirun, os.environ, os.geteuid(), os.cpu_count())
    try:
        if args.output_filename is not None and args.command:
            _prepare_output_directory(args.output_filename, os.geteuid())
        if args.check_build and launch_checks.check_build(args, *facts) != 0:
            return 1
        if args.check_hosts and launch_checks.check_hosts(args, *facts) != 0:
            return 1
        if not args.command:
            return 0
        library = launch_command.installed_loopback_library()
        command = launch_command.mpirun_command(args, *facts, library)
        env = launch_command.launcher_environment(args, os.environ, library)
    except RunnerError as e:
        print(f"tfringrun: error: {e}", file=sys.stderr)
        return 1
    try:
        return _launch_until_done(args, command, env, facts, library)
    finally:
        launch_elastic.remove_commit_directory(args)


def _launch_until_done(args, command, env, facts, library):
    """Runs the job, and an elastic job again on the other hosts each time
    PRRTE ends it on losing a host's daemon; returns the exit status."""
    while True:
        if args.verbose:
            print(shlex.join(command), file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        ended = launch_supervise.run(command, env)
        if not ended.lost_daemon:
            return ended.status
        try:
            args = launch_restart.without_lost_host(args, ended.lost_host)
            command = launch_command.mpirun_command(args, *facts, library)
        except RunnerError as why_not:
            message = daemon_loss.error(ended.lost_host, ended.status)
            if launch_elastic.enabled(args):
                message = (f"{message} tfringrun did not start the job again "
                           f"on the other hosts: {why_not}.")
            print(f"tfringrun: error: {message}", file=sys.stderr, flush=True)
            return daemon_loss.EXIT_STATUS
        print(launch_restart.notice(ended.lost_host, args), file=sys.stderr,
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
