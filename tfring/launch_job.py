# Running a check's mpirun command: bounded in time, output captured, and
# nothing left behind.
#
# Why its own file: the checks start real jobs (a 2-rank allreduce, one
# reporter per host) that can hang on a broken setup (an unreachable host,
# ranks that never meet). A check must end by itself and clean up: past its
# time limit mpirun is asked to stop its ranks, then every process below it
# is killed (mpirun starts each rank in a process group of its own, so
# killing mpirun's group alone would leave ranks behind).

import dataclasses
import json
import os
import signal
import subprocess
import time

from tfring import launch_probes

# How much of a failed job's output a report quotes.
_OUTPUT_TAIL_LINES = 30


@dataclasses.dataclass
class JobResult:
    command: list
    returncode: int  # None when the job ran past its time limit
    output: str  # stdout and stderr, interleaved
    seconds: float

    @property
    def timed_out(self):
        return self.returncode is None

    def reports(self):
        """The probe reports the job printed, in the order printed."""
        found = []
        for line in self.output.splitlines():
            _, mark, payload = line.partition(launch_probes.REPORT_MARK)
            if mark:
                try:
                    found.append(json.loads(payload))
                except ValueError:
                    pass  # A line cut by other output; the check says so.
        return found

    def ending(self, limit):
        return (f"ran past the {limit:g} s limit" if self.timed_out
                else f"exited with status {self.returncode}")

    def tail(self):
        lines = [line for line in self.output.splitlines()
                 if launch_probes.REPORT_MARK not in line]
        shown = "\n".join("    " + line
                          for line in lines[-_OUTPUT_TAIL_LINES:])
        return (f"  last {min(len(lines), _OUTPUT_TAIL_LINES)} lines of "
                f"mpirun's output:\n{shown}" if lines else
                "  mpirun printed nothing.")


def _descendants(pid):
    """Every process below `pid` (children, their children, ...)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, waiting = [], [pid]
    while waiting:
        for child in children.get(waiting.pop(), []):
            found.append(child)
            waiting.append(child)
    return found


def run_job(command, timeout, environ=None):
    """Runs an mpirun command, capturing its output, for at most `timeout`
    seconds. Past that it stops mpirun (which stops its ranks) and then
    kills whatever of the job is left, so nothing outlives the check."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=environ,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        job = _descendants(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for pid in job + ([proc.pid] if proc.poll() is None else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # Already gone.
        output, _ = proc.communicate()
        returncode = None
    return JobResult(command, returncode, output,
                     time.monotonic() - start)
