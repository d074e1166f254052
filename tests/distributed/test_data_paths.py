# The two data paths at any number of ranks: shared memory (the default on
# one host) and MPI (TFRING_SHM=0). Each test re-initializes tfring with
# the knobs it needs and restores the session's setup afterwards.
#
# What is checked: which path init picked (shm_enabled), the same results on
# both paths for every collective and dtype (bit for bit for integers),
# identical bits on every rank for float sums of random values, fused batches
# bigger than the shared slot, many tensors submitted in a different order on
# every rank, and the fallback to MPI with a warning naming the fix when the
# segment cannot be created.

import contextlib
import os
import threading

import numpy as np
import pytest
import tensorflow as tf

import tfring

REDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16,
                 tf.bfloat16, tf.float32, tf.float64]
# Element counts: empty, tiny, not divisible by 2 or 3, several chunks of a
# 128 KiB slot, and above the direct threshold (1 MiB of float32).
COUNTS = [0, 1, 7, 1001, 70001, 300007]


@contextlib.contextmanager
def initialized_with(**knobs):
    """tfring re-initialized with the TFRING_* knobs in `knobs` (None
    removes one); the session's init is restored afterwards."""
    saved = {name: os.environ.get(name) for name in knobs}
    tfring.shutdown()
    for name, value in knobs.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    try:
        tfring.init()
        yield
    finally:
        tfring.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tfring.init()


def _values(count, dtype, rank, seed):
    rng = np.random.default_rng(seed)
    low = 0 if dtype.is_unsigned else -3
    return (rng.integers(low, 4, size=count) + rank % 3).astype(np.int64)


def _battery():
    """Every collective on the current path; returns {name: numpy result}."""
    rank, size = tfring.rank(), tfring.size()
    results = {}
    for dtype in REDUCE_DTYPES:
        for i, count in enumerate(COUNTS):
            x = tf.cast(_values(count, dtype, rank, i), dtype)
            for op_name in ["Sum", "Min", "Max"]:
                op = getattr(tfring, op_name)
                name = f"{dtype.name}_{count}_{op_name}"
                results[name] = tfring.allreduce(x, op=op, name=name).numpy()
            small = tf.cast(_values(count, dtype, rank, i) % 2 + 1, dtype)
            name = f"{dtype.name}_{count}_Product"
            results[name] = tfring.allreduce(small, op=tfring.Product, name=name).numpy()
    for count in COUNTS:
        x = tf.fill([count], float(rank + 1))
        results[f"broadcast_{count}"] = tfring.broadcast(
            x, root_rank=size - 1, name=f"broadcast_{count}").numpy()
        rows = tf.fill([count % 5 + rank, 3], rank)
        results[f"allgather_{count}"] = tfring.allgather(
            rows, name=f"allgather_{count}").numpy()
    grouped = [tf.fill([n * 97 + 1], float(rank + n)) for n in range(40)]
    for n, y in enumerate(tfring.grouped_allreduce(grouped, op=tfring.Average,
                                                   name="grouped")):
        results[f"grouped_{n}"] = y.numpy()
    return results


def _expected(name, size):
    """The exact result of a battery entry, from the inputs of every rank."""
    kind, rest = name.split("_", 1)
    if kind == "broadcast":
        return np.full(int(rest), float(size), np.float32)
    if kind == "allgather":
        count = int(rest)
        return np.concatenate([np.full((count % 5 + r, 3), r, np.int32)
                               for r in range(size)])
    if kind == "grouped":
        n = int(rest)
        return np.full(n * 97 + 1, np.mean([r + n for r in range(size)]),
                       np.float32)
    dtype = tf.as_dtype(kind)
    count_text, op_name = rest.split("_")
    count = int(count_text)
    seed = COUNTS.index(count)
    stack = np.stack([_values(count, dtype, r, seed) for r in range(size)])
    if op_name == "Product":
        stack = stack % 2 + 1
    reduced = {"Sum": np.sum, "Min": np.min, "Max": np.max,
               "Product": np.prod}[op_name](stack, axis=0)
    return reduced


def test_path_chosen_at_init():
    # One host: shared memory, or MPI (the hierarchical path needs several
    # hosts; tests/test_multihost.py covers it).
    with initialized_with(TFRING_SHM=None):
        assert tfring.shm_enabled() == (tfring.size() > 1)
        assert tfring.data_path() == ("shared_memory" if tfring.size() > 1
                                      else "mpi")
    with initialized_with(TFRING_SHM="0", TFRING_HIERARCHICAL_ALLREDUCE="1"):
        assert not tfring.shm_enabled()
        assert tfring.data_path() == "mpi"


def test_both_paths_give_the_exact_results():
    size = tfring.size()
    by_path = {}
    for shm in ["1", "0"]:
        # 128 KiB slots: the larger tensors cross many chunk boundaries.
        with initialized_with(TFRING_SHM=shm, TFRING_SHM_BYTES="131072"):
            assert tfring.shm_enabled() == (shm == "1" and size > 1)
            by_path[shm] = _battery()
    for name, shm_result in by_path["1"].items():
        expected = _expected(name, size)
        mpi_result = by_path["0"][name]
        np.testing.assert_allclose(shm_result.astype(np.float64),
                                   np.asarray(expected, np.float64), rtol=1e-2,
                                   err_msg=f"{name} on shared memory")
        np.testing.assert_allclose(mpi_result.astype(np.float64),
                                   np.asarray(expected, np.float64), rtol=1e-2,
                                   err_msg=f"{name} on MPI")
        if shm_result.dtype.kind in "iub":
            assert shm_result.tobytes() == mpi_result.tobytes(), name


def test_float_sums_are_identical_on_every_rank():
    """Random float32 and bfloat16 values summed: rounding could differ by
    rank if ranks reduced in different orders; the result must not."""
    rank, size = tfring.rank(), tfring.size()
    rng = np.random.default_rng(100 + rank)
    for dtype in [tf.float32, tf.bfloat16, tf.float16, tf.float64]:
        for count in [5, 4099, 600001]:
            x = tf.cast(rng.standard_normal(count) * 1e3, dtype)
            y = tfring.allreduce(x, op=tfring.Sum, name=f"bits_{dtype.name}_{count}")
            bits = tf.bitcast(y, tf.uint8) if dtype.size > 1 else y
            every = tfring.allgather(tf.reshape(bits, [1, -1]),
                                     name=f"bits_gather_{dtype.name}_{count}").numpy()
            for r in range(1, size):
                assert every[r].tobytes() == every[0].tobytes(), (dtype, count, r)


def test_batches_bigger_than_the_slot_and_many_orders():
    """A 128 KiB slot (64 KiB chunks) with a 4 MiB fusion threshold: 60
    tensors, submitted from threads in a different order on every rank, are
    reduced in rounds whose tensors cross many chunk boundaries (over MPI:
    fused batches bigger than the slot)."""
    rank, size = tfring.rank(), tfring.size()
    with initialized_with(TFRING_SHM_BYTES="131072",
                          TFRING_FUSION_THRESHOLD=str(4 << 20)):
        order = np.random.default_rng(rank).permutation(60)
        results = [None] * 60
        errors = []

        def submit(i):
            try:
                x = tf.fill([(i % 7) * 9000 + 1], float(rank + i))
                results[i] = tfring.allreduce(x, op=tfring.Sum, name=f"order_{i}")
            except Exception as error:  # reported below, on this rank
                errors.append(error)

        threads = [threading.Thread(target=submit, args=(int(i),)) for i in order]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        for i, y in enumerate(results):
            expected = sum(float(r + i) for r in range(size))
            assert y.shape[0] == (i % 7) * 9000 + 1
            assert np.all(y.numpy() == expected), i


@pytest.mark.requires_ranks(2)
def test_segment_that_cannot_be_created_falls_back_to_mpi(capfd):
    # More than any /dev/shm holds (the largest value the setting takes):
    # creation fails, the job goes on over MPI.
    with initialized_with(TFRING_SHM_BYTES=str(1 << 40)):
        assert not tfring.shm_enabled()
        y = tfring.allreduce(tf.ones([1000]), op=tfring.Sum, name="fallback")
        assert np.all(y.numpy() == tfring.size())
    err = capfd.readouterr().err
    if tfring.rank() == 0:
        assert "shared memory is not used" in err, err
        assert "TFRING_SHM_BYTES" in err and "--shm-size" in err, err
