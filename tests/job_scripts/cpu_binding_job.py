"""Prints where a rank may run before and after tfring.init(), for
tests/test_cpu_binding.py.

Each rank starts a thread of its own before init (a thread TensorFlow or the
script started earlier must be bound too), checks one Sum allreduce after
init, and prints one line:

    rank R of N before CPUS after CPUS threads CPUS[;CPUS...]

where CPUS is a comma-separated sorted list and `threads` lists the distinct
CPU sets of all the process's threads after init.

Usage: cpu_binding_job.py
"""
import os
import threading

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import tfring  # noqa: E402


def cpus(cpu_set):
    return ",".join(str(cpu) for cpu in sorted(cpu_set))


release = threading.Event()
early = threading.Thread(target=release.wait, daemon=True)
early.start()
before = os.sched_getaffinity(0)
tfring.init()
after = os.sched_getaffinity(0)
thread_sets = {cpus(os.sched_getaffinity(int(task)))
               for task in os.listdir("/proc/self/task")}
total = tfring.allreduce(tf.constant([1.0]), op=tfring.Sum).numpy()[0]
assert total == tfring.size(), total
print(f"rank {tfring.rank()} of {tfring.size()} before {cpus(before)} "
      f"after {cpus(after)} threads {';'.join(sorted(thread_sets))}",
      flush=True)
release.set()
tfring.shutdown()
