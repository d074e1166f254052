"""One rank fails while another waits in a collective; run by test_failures.py.

Usage: peer_failure.py <mode>
  exception: the last rank raises an uncaught exception (Python exits, its
             atexit hook shuts tfring down); rank 0 must get AbortedError
             naming that rank.
  kill:      the last rank SIGKILLs itself; mpirun must end the job.
  kill_in_allreduce: every rank runs 8 MiB allreduces (through shared
             memory, chunk by chunk through the slots) in a loop; a thread of
             the last rank SIGKILLs it in the middle of one. The job must end;
             a survivor that notices first reports the dead rank by number.
  stop_in_allreduce <flag file> <resume|keep>: every rank runs 256 MiB
             allreduces in a loop while a helper process holds the last rank
             (SIGSTOP) for 3 s at a time, again and again, until one hold
             lands inside an allreduce's data phase (a hold during a
             negotiation only delays it). With TFRING_SHM_TIMEOUT_SECONDS=1
             the others then fail it with AbortedError, create the flag
             file, and exit after TFRING_TEST_LINGER_SECONDS. `resume`: the
             helper resumes the held rank, which must fail the same
             allreduce, never complete it; `keep`: it stays held, and the
             others' exit must still end the job.
  stall:     the last rank submits 'late_tensor' 3 s after the others; with
             TFRING_STALL_CHECK_TIME_SECONDS=1 rank 0 warns who is missing,
             then the collective completes.
  stall_limit: rank r allreduces 'only_on_rank_<r>', which no other rank
             submits; with a short TFRING_STALL_SHUTDOWN_TIME_SECONDS every
             rank must fail it with the stall error, printed on one line.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import tensorflow as tf

import tfring as hvd

mode = sys.argv[1]
hvd.init()
last = hvd.size() - 1
# A first collective proves every rank is up before one of them fails.
hvd.allreduce(tf.constant(1.0), name="warmup")

if mode == "stall":
    if hvd.rank() == last:
        time.sleep(3)
    result = hvd.allreduce(tf.constant(2.0), op=hvd.Sum, name="late_tensor")
    print(f"rank {hvd.rank()} STALL_DONE {float(result)}", flush=True)
    sys.exit(0)

if mode == "stall_limit":
    try:
        hvd.allreduce(tf.constant(1.0), name=f"only_on_rank_{hvd.rank()}")
        print(f"rank {hvd.rank()} UNEXPECTED_SUCCESS", flush=True)
    except tf.errors.AbortedError as error:
        one_line = error.message.replace("\n", " | ")
        print(f"rank {hvd.rank()} STALL_ERROR {one_line}", flush=True)
    sys.exit(0)

if mode in ("kill_in_allreduce", "stop_in_allreduce"):
    print(f"rank {hvd.rank()} SHM {hvd.shm_enabled()}", flush=True)
    if hvd.rank() == last and mode == "kill_in_allreduce":
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
    elif hvd.rank() == last:
        flag, after_failure = sys.argv[2], sys.argv[3]
        keep = "exit" if after_failure == "keep" else "true"
        subprocess.Popen(["sh", "-c", f"""
            while sleep 0.4; do
              kill -STOP {os.getpid()} 2>/dev/null || exit
              sleep 3
              [ -e {flag} ] && {keep}
              kill -CONT {os.getpid()}
            done"""])
    data = tf.ones([2 * 1024 * 1024 if mode == "kill_in_allreduce" else 64 * 1024 * 1024])
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60:
            hvd.allreduce(data, op=hvd.Sum, name="big")
        print(f"rank {hvd.rank()} UNEXPECTED_SUCCESS", flush=True)
    except tf.errors.AbortedError as error:
        print(f"rank {hvd.rank()} ABORTED after {time.monotonic() - start:.2f} s: "
              f"{error.message}", flush=True)
        if mode == "stop_in_allreduce":
            open(sys.argv[2], "w").close()
    time.sleep(float(os.environ.get("TFRING_TEST_LINGER_SECONDS", "0")))
    print(f"rank {hvd.rank()} EXITING", flush=True)
    sys.exit(1)

if hvd.rank() == last:
    time.sleep(1)  # let the others block in the collective below
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("deliberate failure on the last rank")

start = time.monotonic()
try:
    hvd.allreduce(tf.constant(1.0), name="never_completed")
    print(f"rank {hvd.rank()} UNEXPECTED_SUCCESS", flush=True)
except tf.errors.AbortedError as error:
    print(f"rank {hvd.rank()} ABORTED after {time.monotonic() - start:.2f} s: {error.message}",
          flush=True)
    # Later collectives fail fast with a clear message instead of hanging.
    try:
        hvd.allreduce(tf.constant(1.0), name="after_abort")
    except (tf.errors.OpError, ValueError) as later:
        print(f"rank {hvd.rank()} LATER_FAILS_FAST: {later}", flush=True)
