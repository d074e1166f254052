# Ending processes for good: the test launcher (tests/mpi_launch.py), the
# benchmarks' process groups (benchmarks/_keras_workers.py) and the
# namespace hosts (tools/netns_hosts.py) must leave nothing running after a
# job that hung or failed, including processes mpirun started and no longer
# watches. They find those processes by what marks them (a tag in the
# environment, a network namespace) and SIGKILL until none is left.

import os
import signal
import time


def pids_with_environment_entry(name, value):
    """Processes (other than this one) whose environment has name=value."""
    needle = f"{name}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone already, or not ours to read
            continue
    return pids


def kill_until_gone(find_pids, deadline_s, pause_s):
    """SIGKILLs what `find_pids()` returns, again every `pause_s` seconds,
    until it returns nothing or `deadline_s` seconds have passed; returns the
    pids still found then (empty when every process ended)."""
    deadline = time.monotonic() + deadline_s
    while True:
        pids = find_pids()
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(pause_s)
