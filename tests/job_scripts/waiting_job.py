"""A 2-rank tfring job that stays up until told to finish; run by
tests/test_launch_exposure.py, which lists the job's listening sockets
while it waits.

Each rank starts tfring, checks one Sum allreduce, prints
`ready rank R pid P shm S`, then waits for the file RELEASE to appear (at
most 300 s), checks a second allreduce and prints `done rank R`.

With --user-server each rank also opens a TCP socket of its own, listening
on every address (0.0.0.0, a port the OS picks), as a script's own server
would, and prints `user server rank R port P`.

Usage: waiting_job.py RELEASE [--user-server]
"""
import os
import socket
import sys
import time

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import tfring  # noqa: E402


def checked_sum(name):
    total = tfring.allreduce(tf.constant([float(tfring.rank() + 1)]),
                             op=tfring.Sum, name=name).numpy()[0]
    size = tfring.size()
    assert total == size * (size + 1) / 2, (name, total)


tfring.init()
checked_sum("before")
if "--user-server" in sys.argv[2:]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("0.0.0.0", 0))
    server.listen()
    print(f"user server rank {tfring.rank()} port "
          f"{server.getsockname()[1]}", flush=True)
print(f"ready rank {tfring.rank()} pid {os.getpid()} "
      f"shm {tfring.shm_enabled()}", flush=True)
release, deadline = sys.argv[1], time.monotonic() + 300
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.1)
checked_sum("after")
print(f"done rank {tfring.rank()}", flush=True)
