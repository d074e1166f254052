"""The last rank is SIGKILLed while every rank runs allreduces; run by
tests/test_multihost.py with the last rank on another host than rank 0.

The last rank prints `KILLING rank R on HOST at T` (T from time.time(), so
the test can time how long the job takes to end) and SIGKILLs itself from
a timer thread in the middle of its allreduces. A survivor that notices the
failure itself (before mpirun ends it) prints
`rank R ABORTED after S s: MESSAGE`.
"""
import os
import signal
import socket
import sys
import threading
import time

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)

import tfring  # noqa: E402

KILL_AFTER_S = 1.0
RUN_FOR_S = 60.0


def kill_myself():
    print(f"KILLING rank {tfring.rank()} on {socket.gethostname()} at "
          f"{time.time():.3f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


tfring.init()
# A first collective proves every rank is up before one of them dies.
tfring.allreduce(tf.constant(1.0), name="warmup")
if tfring.rank() == tfring.size() - 1:
    threading.Timer(KILL_AFTER_S, kill_myself).start()
data = tf.ones([256 * 1024])
start = time.monotonic()
try:
    while time.monotonic() - start < RUN_FOR_S:
        tfring.allreduce(data, op=tfring.Sum, name="steps")
    print(f"rank {tfring.rank()} UNEXPECTED_SUCCESS", flush=True)
except tf.errors.AbortedError as error:
    print(f"rank {tfring.rank()} ABORTED after "
          f"{time.monotonic() - start:.2f} s: {error.message}", flush=True)
sys.exit(1)
