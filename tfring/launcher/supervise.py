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

import signal
import subprocess
import sys
import time

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


def run(command, env, err=sys.stderr):
    """Runs `command` (mpirun) in `env` until it ends; returns tfringrun's
    exit status."""
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
        proc = subprocess.Popen(command, env=env)
        started.append(proc)
        # A signal that came before mpirun ran did not reach it.
        forward_at = time.monotonic() if received else None
        while True:
            try:
                returncode = proc.wait(_POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if received and forward_at is None:
                forward_at = time.monotonic() + FORWARD_AFTER_S
            elif forward_at is not None and time.monotonic() >= forward_at:
                # The signal reached tfringrun alone: pass it on, once.
                proc.send_signal(received[0])
                forward_at = float("inf")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        signum = received[0]
        print(f"tfringrun: the job was stopped by {STOPPING[signum]}; "
              f"mpirun ended every rank. Exit status {128 + signum}.",
              file=err, flush=True)
        return 128 + signum
    if returncode < 0:  # mpirun itself was killed (SIGKILL, say)
        print(f"tfringrun: mpirun was killed by "
              f"{signal.Signals(-returncode).name}. Exit status "
              f"{128 - returncode}.", file=err, flush=True)
        return 128 - returncode
    return returncode
