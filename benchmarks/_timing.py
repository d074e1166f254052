"""Timing, checking and reporting shared by benchmarks/allreduce.py's cases.

A case is a dict {label: fn} of variants doing the same job; labels starting
with "mpi4py" are the raw-MPI baselines, the others tfring's. A baseline
whose label contains "in place" leaves its result where its input was; the
others write a separate output, as tfring does.
"""

import mmap
import time

import numpy as np
from mpi4py import MPI

KIB = 1024
MIB = 1024 * KIB


def measure(comm, variants, repeats, run_length=1):
    """Times `variants` ({label: fn}) interleaved; returns {label: seconds[]}
    with, for each repetition, the time of the slowest rank. With
    `run_length` > 1 each variant runs that many repetitions in a row (each
    timed on its own, after a barrier) before the next variant's turn, as a
    loop calls one op after another; `repeats` counts them all."""
    labels = list(variants)
    for label in labels:
        for _ in range(2):
            comm.Barrier()
            variants[label]()
    times = {label: [] for label in labels}
    for r in range(max(1, repeats // run_length)):
        shift = r % len(labels)
        for label in labels[shift:] + labels[:shift]:
            for _ in range(run_length):
                comm.Barrier()
                start = time.perf_counter()
                variants[label]()
                times[label].append(time.perf_counter() - start)
    every_rank = comm.allgather(times)
    return {label: np.max([t[label] for t in every_rank], axis=0)
            for label in labels}


def check(what, got, expected):
    """Raises unless `got` (array or tensor) equals `expected` exactly."""
    got = np.asarray(got)
    if got.shape != np.shape(expected) or not np.array_equal(got, expected):
        raise AssertionError(
            f"{what}: wrong result on rank {MPI.COMM_WORLD.Get_rank()}: got "
            f"shape {got.shape} {got.ravel()[:4]}..., expected shape "
            f"{np.shape(expected)} {np.asarray(expected).ravel()[:4]}...")


def rank_data(rank, shape):
    """Rank `rank`'s input: small float32 integers, so that every rank can
    rebuild any rank's data and sums over ranks are exact."""
    rng = np.random.default_rng(1000 + rank)
    return rng.integers(0, 1024, size=shape).astype(np.float32)


def private_array(shape, dtype=np.float32, fill=0):
    """An array for a raw-MPI baseline, in private anonymous memory with
    transparent huge pages where it is large: the fastest memory the
    baseline can have, whatever the allocator serves."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    memory = mmap.mmap(-1, max(count * dtype.itemsize, 1),
                       flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if count * dtype.itemsize >= 4 * MIB and hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE)
    array = np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)
    array[...] = fill
    return array


def describe_size(num_bytes):
    return f"{num_bytes // MIB} MiB" if num_bytes >= MIB else \
        f"{num_bytes // KIB} KiB"


def print_table(results):
    """results: [(case, {label: seconds[]})]; rank 0 only."""
    case_width = max([15] + [len(case) for case, _ in results])
    label_width = max([44] + [len(label) for _, times in results
                              for label in times])
    header = (f"{'case':<{case_width}} {'variant':<{label_width}} "
              f"{'median ms':>9} {'min ms':>8} {'/best MPI':>11} "
              f"{'/best src->dst':>14}")
    print(header)
    print("-" * len(header))
    for case, times in results:
        mpi = {k: v for k, v in times.items() if k.startswith("mpi4py")}
        # tfring's output is a new tensor, so "src->dst" MPI variants (not
        # in place) do the same job; in place is the best MPI can do.
        out_of_place = [v for k, v in mpi.items() if "in place" not in k]
        best_median = min(np.median(v) for v in mpi.values())
        best_min = min(np.min(v) for v in mpi.values())
        best_oop = min(np.median(v) for v in out_of_place)
        for label, t in times.items():
            median, low = np.median(t), np.min(t)
            ratios = "" if label in mpi else (
                f"{f'{median / best_median:.2f}/{low / best_min:.2f}':>11} "
                f"{median / best_oop:14.2f}")
            print(f"{case:<{case_width}} {label:<{label_width}} "
                  f"{median * 1e3:9.3f} {low * 1e3:8.3f} {ratios}")
        print()
    print("times: the slowest rank's, per repetition. /best MPI: tfring "
          "median/median and min/min\nagainst the fastest mpi4py variant of "
          "the case; /best src->dst: median against the\nfastest mpi4py "
          "variant that, like tfring, writes a separate output.")
