"""Allreduce steps under TFRING_AUTOTUNE and TFRING_TIMELINE; run by
tests/test_tuning_and_timeline_jobs.py.

Every step's results are checked on every rank: the autotuner changes the
fusion and direct thresholds while the job runs, and every rank must switch
at the same round. No tfring.shutdown(): the timeline must be closed at
interpreter exit.

Usage: tuned_training_steps.py STEPS
"""
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)

import tfring  # noqa: E402

SIZES = (1000, 20000, 300000, 5000, 70000)

tfring.init()
steps = int(sys.argv[1])
rank, size = tfring.rank(), tfring.size()
for step in range(steps):
    tensors = [tf.fill([n], float(rank + step)) for n in SIZES]
    results = tfring.grouped_allreduce(tensors, op=tfring.Sum, name="tuned")
    expected = float(sum(r + step for r in range(size)))
    for result in results:
        values = result.numpy()
        if not np.all(values == expected):
            print(f"rank {rank} WRONG at step {step}: {values[:4]} != {expected}", flush=True)
            sys.exit(1)
print(f"rank {rank} STEPS_OK", flush=True)
