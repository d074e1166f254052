"""Every collective across hosts; run by tests/test_multihost.py.

Each rank checks every result against the value computed here with NumPy
and prints one line, `RESULT <json>`: its host name, the topology tfring
reports, whether shared memory is in use, the shared-memory segments it
maps, the names of the checks it ran and a description of each that
failed. The test decides what the topology must be (it knows which host
each rank was placed on).

Usage: multihost_collectives.py (under tfringrun or mpirun, any size >= 2)
"""
import json
import socket

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)

import tfring  # noqa: E402

# Dynamic process sets: one per host is added below, once the hosts are known.
tfring.init(process_sets="dynamic")
rank, size = tfring.rank(), tfring.size()
checks, failures = [], []


def check(name, result, expected):
    """Records check `name`: `result` (a tensor) must equal `expected`."""
    checks.append(name)
    got = result.numpy() if hasattr(result, "numpy") else np.asarray(result)
    expected = np.asarray(expected)
    if got.shape != expected.shape or not np.array_equal(
            got.astype(np.float64), expected.astype(np.float64)):
        failures.append(f"{name}: got {got.ravel()[:8].tolist()} shape "
                        f"{list(got.shape)}, expected "
                        f"{expected.ravel()[:8].tolist()} shape "
                        f"{list(expected.shape)}")


def mapped_segments():
    """tfring's shared-memory segments in this process, as "device inode"
    of their /dev/shm file (from /proc/self/maps; the name is unlinked)."""
    segments = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and "/tfring-" in fields[5]:
                segments.add(f"{fields[3]} {fields[4]}")
    return sorted(segments)


def rank_values(r, count):
    """Rank r's input: small integers, exact in every dtype tested."""
    return (np.arange(count) % 7 + r + 1).astype(np.float64)


# Allreduce, eager, in every reduction dtype: Sum, then Average (integer
# Average truncates toward zero).
for dtype in (tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16,
              tf.bfloat16, tf.float32, tf.float64):
    mine = tf.cast(rank_values(rank, 12), dtype)
    total = sum(rank_values(r, 12) for r in range(size))
    check(f"allreduce sum {dtype.name}",
          tfring.allreduce(mine, op=tfring.Sum, name=f"sum_{dtype.name}"),
          total)
    check(f"allreduce average {dtype.name}",
          tfring.allreduce(mine, op=tfring.Average, name=f"avg_{dtype.name}"),
          np.trunc(total / size) if dtype.is_integer else total / size)

# One allreduce large enough to skip the fusion buffer (4 MiB of float32).
big = rank_values(rank, 1 << 20)
check("allreduce sum float32 4 MiB",
      tfring.allreduce(tf.constant(big, tf.float32), op=tfring.Sum, name="big"),
      sum(rank_values(r, 1 << 20) for r in range(size)))
# More of them, past the default's trials of each path (with
# TFRING_HIERARCHICAL_TRIALS=2 from the test: 4 to warm up, 4 timed, then
# the ranks agree on one path): the same exact sums whichever path ran.
for step in range(12):
    check(f"allreduce sum float32 4 MiB, {step}",
          tfring.allreduce(tf.constant(big, tf.float32) * (step + 1),
                           op=tfring.Sum, name=f"big_{step}"),
          sum(rank_values(r, 1 << 20) for r in range(size)) * (step + 1))

# A reduction inside a tf.function (Max: the last rank's values).
@tf.function
def reduce_in_function(x):
    return tfring.allreduce(x, op=tfring.Max)


check("allreduce max in tf.function",
      reduce_in_function(tf.constant(rank_values(rank, 5), tf.float32)),
      rank_values(size - 1, 5))

# Grouped allreduce: tensors of several shapes and dtypes in one burst.
shapes_and_types = [([3], tf.float32), ([2, 5], tf.float64), ([], tf.int32),
                    ([4, 1, 2], tf.float32), ([0], tf.float32)]
group = [tf.cast(rank_values(rank, int(np.prod(shape))).reshape(shape), dtype)
         for shape, dtype in shapes_and_types]
for index, result in enumerate(tfring.grouped_allreduce(
        group, op=tfring.Sum, name="group")):
    shape = shapes_and_types[index][0]
    check(f"grouped_allreduce tensor {index}", result,
          sum(rank_values(r, int(np.prod(shape))) for r in range(size))
          .reshape(shape))

# Allgather with a different first dimension on every rank: rank r gives
# r + 1 rows of r.
for dtype in (tf.float32, tf.int64):
    rows = tf.cast(np.full([rank + 1, 3], rank), dtype)
    check(f"allgather uneven {dtype.name}",
          tfring.allgather(rows, name=f"gather_{dtype.name}"),
          np.concatenate([np.full([r + 1, 3], r) for r in range(size)]))

# Broadcast from the first rank and from the last (on another host).
for root in (0, size - 1):
    check(f"broadcast from rank {root}",
          tfring.broadcast(tf.constant(rank_values(rank, 6)), root_rank=root,
                           name=f"bcast_{root}"),
          rank_values(root, 6))

# Alltoall with uneven splits: rank r sends (r + j) % 3 rows to rank j, each
# row holding (sender, receiver); so rank j gets (r + j) % 3 rows from each r.
splits = [(rank + j) % 3 for j in range(size)]
outgoing = np.concatenate([np.tile([rank, j], (splits[j], 1))
                           for j in range(size)]).astype(np.int32)
received, received_splits = tfring.alltoall(
    tf.constant(outgoing.reshape(-1, 2)), splits=splits, name="a2a")
check("alltoall rows", received,
      np.concatenate([np.tile([r, rank], ((r + rank) % 3, 1))
                      for r in range(size)]).reshape(-1, 2))
check("alltoall received splits", received_splits,
      [(r + rank) % 3 for r in range(size)])

# Reducescatter of 2 * size + 1 rows: the first rows' ranks get one more.
num_rows = 2 * size + 1
summed = sum(rank_values(r, num_rows * 2) for r in range(size)).reshape(-1, 2)
first = rank * 2 + min(rank, num_rows % size)
mine_rows = 2 + (1 if rank < num_rows % size else 0)
check("reducescatter sum uneven",
      tfring.reducescatter(tf.constant(rank_values(rank, num_rows * 2)
                                       .reshape(-1, 2)),
                           op=tfring.Sum, name="rs"),
      summed[first:first + mine_rows])

# One process set per host (collective over every rank, the same calls in
# the same order everywhere): inside a set, the ranks share a host.
hosts = tfring.allgather_object(socket.gethostname())
host_sets = {}
for host in sorted(set(hosts)):
    host_sets[host] = tfring.add_process_set(
        [r for r, h in enumerate(hosts) if h == host])
my_set = host_sets[hosts[rank]]
check("allreduce sum in this host's process set",
      tfring.allreduce(tf.constant(rank_values(rank, 1000), tf.float32),
                       op=tfring.Sum, name="per_host", process_set=my_set),
      sum(rank_values(r, 1000) for r in my_set.ranks))
check("allgather in this host's process set",
      tfring.allgather(tf.constant([[rank]]), name="per_host_gather",
                       process_set=my_set),
      np.array(my_set.ranks).reshape(-1, 1))

# A last collective over every rank before any rank shuts tfring down:
# shutdown() on one rank cancels the collectives still pending on the others,
# including another host's process-set collectives.
tfring.allreduce(tf.constant(0), name="all_done")
segments = mapped_segments()

print("RESULT " + json.dumps({
    "rank": rank, "size": size, "host": socket.gethostname(), "hosts": hosts,
    "local_rank": tfring.local_rank(), "local_size": tfring.local_size(),
    "cross_rank": tfring.cross_rank(), "cross_size": tfring.cross_size(),
    "is_homogeneous": tfring.is_homogeneous(),
    "shm_enabled": tfring.shm_enabled(), "data_path": tfring.data_path(),
    "segments": segments,
    "checks": checks, "failures": failures}), flush=True)
tfring.shutdown()
