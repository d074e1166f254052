# Runs the job's mpirun as a child of tfringrun and passes on its end.
#
# Why not exec mpirun: a job stopped by Ctrl-C would end with mpirun's exit
# status 1 and no word about it, like a job that failed. tfringrun waits
# for mpirun instead, and when a signal stopped the job it says so and
# exits as a shell reports a process killed by that signal (130 for
# SIGINT, 143 for SIGTERM, 129 for SIGHUP); otherwise mpirun's exit status
# is tfringrun's.
#
# Who delivers the signal: Ctrl-C in a terminal, and batch systems, signal
# every process of the job, mpirun included, and mpirun then stops every
# rank (it takes about a second). A second SIGINT would make mpirun print
# "Abort is in progress...hit ctrl-c again to forcibly terminate", so
# tfringrun does not pass the signal on at once: only when mpirun still
# runs FORWARD_AFTER_S later, which happens when the signal was sent to
# tfringrun alone (`kill -INT PID`). SIGUSR1 and SIGUSR2, which mpirun
# passes to every rank, are passed on at once, so that `kill -USR1 PID`
# reaches the ranks as it did when tfringrun exec'd mpirun (sent to the
# whole process group, such a signal reaches mpirun twice).
#
# mpirun's stderr (its own messages and the ranks' stderr) comes through a
# pipe that tfringrun copies, byte for byte as it comes, to its own stderr,
# watching it for PRRTE's message that it lost a host's daemon
# (tfring/launcher/daemon_loss.py): mpirun then exits with status 0 though
# it ended every rank; run() says so to its caller (tfring/launcher/cli.py),
# which starts an elastic job again on the other hosts or ends with
# daemon_loss.EXIT_STATUS. The copying happens in the loop that waits for
# mpirun (select on the pipe), so no thread is needed and signals are
# handled as before.

import dataclasses
import os
import select
import signal
import subprocess
import sys
import time

from tfring.launcher import daemon_loss

# Signals that stop the job, and the name tfringrun reports for each.
STOPPING = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM",
            signal.SIGHUP: "SIGHUP"}
# Signals mpirun passes on to the ranks.
PASSED_ON = (signal.SIGUSR1, signal.SIGUSR2)
# Seconds mpirun is given to stop on a signal it got itself before
# tfringrun sends it on.
FORWARD_AFTER_S = 3.0
# How often tfringrun looks whether mpirun has ended, in seconds.
_POLL_S = 0.1
# Once mpirun has ended, its stderr is read until it closes or is quiet
# this long: a process mpirun started (the launch agent of a remote
# daemon) may still hold the pipe open.
_QUIET_AFTER_EXIT_S = 0.2
_READ_BYTES = 65536


class _StderrRelay:
    """Copies mpirun's stderr pipe to tfringrun's stderr unchanged, and
    shows every chunk to a daemon_loss.Watch."""

    def __init__(self, pipe, err):
        self.watch = daemon_loss.Watch()
        self._pipe = pipe
        self._err = err
        self.open = True

    def pump(self, timeout_s):
        """Copies what arrives within `timeout_s`; returns whether
        anything (or the pipe's end) arrived."""
        readable, _, _ = select.select([self._pipe], [], [], timeout_s)
        if not readable:
            return False
        chunk = os.read(self._pipe.fileno(), _READ_BYTES)
        if not chunk:
            self.open = False
            return True
        self.watch.feed(chunk)
        self._write(chunk)
        return True

    def drain(self):
        """After mpirun ended: copies what is left."""
        while self.open and self.pump(_QUIET_AFTER_EXIT_S):
            pass
        self._pipe.close()

    def _write(self, chunk):
        try:
            self._err.flush()
            out = self._err.fileno()
            while chunk:
                chunk = chunk[os.write(out, chunk):]
        except (OSError, ValueError):
            # tfringrun's stderr is gone (a closed pipe): the output is
            # dropped, and mpirun's pipe is still read so mpirun never
            # blocks on it.
            pass


@dataclasses.dataclass(frozen=True)
class Ended:
    """How mpirun ended: tfringrun's exit status, unless PRRTE lost a
    host's daemon (then `status` is mpirun's, and the caller decides)."""
    status: int
    lost_daemon: bool = False
    lost_host: str = None  # the host PRRTE named, if it named one


def run(command, env, err=sys.stderr):
    """Runs `command` (mpirun) in `env` until it ends; returns Ended."""
    received = []  # the stopping signals, in the order they came
    started = []  # the mpirun process, once it runs

    def on_stopping(signum, frame):
        received.append(signal.Signals(signum))

    def on_passed_on(signum, frame):
        if started and started[0].poll() is None:
            started[0].send_signal(signum)

    previous = {signum: signal.signal(signum, on_stopping)
                for signum in STOPPING}
    previous.update((signum, signal.signal(signum, on_passed_on))
                    for signum in PASSED_ON)
    try:
        proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        started.append(proc)
        relay = _StderrRelay(proc.stderr, err)
        # A signal that came before mpirun ran did not reach it.
        forward_at = time.monotonic() if received else None
        while True:
            if relay.open:
                relay.pump(_POLL_S)
            else:  # mpirun closed its stderr but runs on
                try:
                    proc.wait(_POLL_S)
                except subprocess.TimeoutExpired:
                    pass
            returncode = proc.poll()
            if returncode is not None:
                break
            if received and forward_at is None:
                forward_at = time.monotonic() + FORWARD_AFTER_S
            elif forward_at is not None and time.monotonic() >= forward_at:
                # The signal reached tfringrun alone: pass it on, once.
                proc.send_signal(received[0])
                forward_at = float("inf")
        relay.drain()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        signum = received[0]
        print(f"tfringrun: the job was stopped by {STOPPING[signum]}; "
              f"mpirun ended every rank. Exit status {128 + signum}.",
              file=err, flush=True)
        return Ended(128 + signum)
    if returncode < 0:  # mpirun itself was killed (SIGKILL, say)
        print(f"tfringrun: mpirun was killed by "
              f"{signal.Signals(-returncode).name}. Exit status "
              f"{128 - returncode}.", file=err, flush=True)
        return Ended(128 - returncode)
    if relay.watch.lost:
        return Ended(returncode, lost_daemon=True, lost_host=relay.watch.host)
    return Ended(returncode)
