"""tfring allreduce vs raw MPI (mpi4py) on the same buffers, in one job.

    tfringrun -np 2 python benchmarks/allreduce.py [--repeats 20]

Cases:
  * one float32 tensor of 4 KiB, 256 KiB, 4 MiB and 64 MiB: mpi4py
    Allreduce in place and out of place vs tfring allreduce(op=Sum) eagerly
    and inside a tf.function;
  * the ResNet-50 gradient set (the shapes of ResNet50(weights=None)'s
    trainable variables): tfring in one tf.function (grouped_allreduce, and
    one allreduce per tensor) vs mpi4py one Allreduce per tensor vs mpi4py
    one Allreduce of all tensors packed into one buffer (pack and unpack
    copies included);
  * the latency of a lone 4 KiB allreduce, over many repetitions.

Method: all variants of a case run interleaved, repetition by repetition (in
a rotating order), so drift of the machine affects them alike. Every timed
repetition starts after comm.Barrier(); its time is the slowest rank's. Each
variant runs twice untimed first (tracing, negotiation, first allocations).
Rank 0 prints median and min in ms, and for tfring the ratio to the best MPI
variant of the case (median/median and min/min; below 1 means tfring wins)
and to the best MPI variant that writes a separate output as tfring does.
"""

import argparse
import os
import socket
import time

# TensorFlow's C++ info logs would drown the table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402  (mpi4py initialises MPI, tfring joins)
import tensorflow as tf  # noqa: E402

import tfring as hvd  # noqa: E402
import tfring._core  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
SIZES = (4 * KIB, 256 * KIB, 4 * MIB, 64 * MIB)
RESNET50_TENSORS = 214
RESNET50_VALUES = 25_583_592


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed repetitions per variant (default 20)")
    parser.add_argument("--latency-repeats", type=int, default=500,
                        help="timed repetitions of the lone 4 KiB allreduce")
    parser.add_argument("--intra-op-threads", type=int, default=1,
                        help="TensorFlow intra-op threads per rank (default "
                             "1; 0 for TensorFlow's default)")
    return parser.parse_args()


def measure(comm, variants, repeats):
    """Times `variants` ({label: fn}) interleaved; returns {label: seconds[]}
    with, for each repetition, the time of the slowest rank."""
    labels = list(variants)
    for label in labels:
        for _ in range(2):
            comm.Barrier()
            variants[label]()
    times = {label: [] for label in labels}
    for r in range(repeats):
        shift = r % len(labels)
        for label in labels[shift:] + labels[:shift]:
            comm.Barrier()
            start = time.perf_counter()
            variants[label]()
            times[label].append(time.perf_counter() - start)
    every_rank = comm.allgather(times)
    return {label: np.max([t[label] for t in every_rank], axis=0)
            for label in labels}


def check(what, got, expected):
    if not np.array_equal(np.asarray(got), expected):
        raise AssertionError(
            f"{what}: wrong result on rank {hvd.rank()}: got "
            f"{np.asarray(got).ravel()[:4]}..., expected "
            f"{np.asarray(expected).ravel()[:4]}...")


def single_tensor_variants(comm, num_bytes):
    """mpi4py and tfring variants reducing one float32 tensor of num_bytes."""
    count = num_bytes // 4
    # Values every rank can sum exactly; the in-place buffer stays zero so
    # repeated in-place sums never grow.
    src = np.full(count, comm.Get_rank() + 1, dtype=np.float32)
    dst = np.empty_like(src)
    in_place = np.zeros_like(src)
    tensor = tf.constant(src)
    expected = np.full(count, comm.Get_size() * (comm.Get_size() + 1) / 2,
                       dtype=np.float32)

    @tf.function
    def reduce_in_function(x):
        return hvd.allreduce(x, op=hvd.Sum)

    variants = {
        "mpi4py Allreduce in place":
            lambda: comm.Allreduce(MPI.IN_PLACE, in_place),
        "mpi4py Allreduce src->dst":
            lambda: comm.Allreduce(src, dst),
        "tfring allreduce eager":
            lambda: hvd.allreduce(tensor, op=hvd.Sum),
        "tfring allreduce tf.function":
            lambda: reduce_in_function(tensor),
    }
    comm.Allreduce(src, dst)
    check("mpi4py", dst, expected)
    check("tfring eager", hvd.allreduce(tensor, op=hvd.Sum), expected)
    check("tfring tf.function", reduce_in_function(tensor), expected)
    return variants


def resnet50_shapes():
    import keras
    model = keras.applications.ResNet50(weights=None)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    del model
    keras.backend.clear_session()
    values = sum(int(np.prod(s)) for s in shapes)
    if (len(shapes), values) != (RESNET50_TENSORS, RESNET50_VALUES):
        print(f"note: ResNet-50 has {len(shapes)} trainable tensors with "
              f"{values:,} values here (expected {RESNET50_TENSORS} and "
              f"{RESNET50_VALUES:,})", flush=True)
    return shapes


def resnet50_variants(comm, shapes):
    """Variants reducing the ResNet-50 gradient set."""
    value = comm.Get_rank() + 1
    expected_value = comm.Get_size() * (comm.Get_size() + 1) / 2
    srcs = [np.full(s, value, dtype=np.float32) for s in shapes]
    dsts = [np.empty_like(a) for a in srcs]
    in_place = [np.zeros_like(a) for a in srcs]
    tensors = [tf.constant(a) for a in srcs]
    packed = np.empty(sum(a.size for a in srcs), dtype=np.float32)
    views, offset = [], 0
    for a in srcs:
        views.append(packed[offset:offset + a.size].reshape(a.shape))
        offset += a.size

    def per_tensor(dest):
        for a, d in zip(srcs, dest):
            comm.Allreduce(a, d)

    def per_tensor_in_place():
        for a in in_place:
            comm.Allreduce(MPI.IN_PLACE, a)

    def pack_reduce_unpack():
        for a, v in zip(srcs, views):
            np.copyto(v, a)
        comm.Allreduce(MPI.IN_PLACE, packed)
        for v, d in zip(views, dsts):
            np.copyto(d, v)

    @tf.function
    def grouped(ts):
        return hvd.grouped_allreduce(ts, op=hvd.Sum)

    @tf.function
    def one_op_per_tensor(ts):
        return [hvd.allreduce(t, op=hvd.Sum) for t in ts]

    variants = {
        "mpi4py one Allreduce per tensor src->dst": lambda: per_tensor(dsts),
        "mpi4py one Allreduce per tensor in place": per_tensor_in_place,
        "mpi4py packed: copy in, Allreduce, copy out": pack_reduce_unpack,
        "tfring grouped_allreduce tf.function": lambda: grouped(tensors),
        "tfring allreduce per tensor tf.function":
            lambda: one_op_per_tensor(tensors),
    }
    for label, results in [("tfring grouped", grouped(tensors)),
                           ("tfring per tensor", one_op_per_tensor(tensors))]:
        for r in (results[0], results[-1], results[len(results) // 2]):
            check(label, r, np.full(r.shape, expected_value, np.float32))
    pack_reduce_unpack()
    check("mpi4py packed", dsts[0], np.full(shapes[0], expected_value,
                                            np.float32))
    return variants


def describe_size(num_bytes):
    return f"{num_bytes // MIB} MiB" if num_bytes >= MIB else \
        f"{num_bytes // KIB} KiB"


def print_table(results):
    """results: [(case, {label: seconds[]})]; rank 0 only."""
    header = (f"{'case':<15} {'variant':<44} {'median ms':>9} {'min ms':>8} "
              f"{'/best MPI':>11} {'/best src->dst':>14}")
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
            print(f"{case:<15} {label:<44} {median * 1e3:9.3f} "
                  f"{low * 1e3:8.3f} {ratios}")
        print()
    print("times: the slowest rank's, per repetition. /best MPI: tfring "
          "median/median and min/min\nagainst the fastest mpi4py variant of "
          "the case; /best src->dst: median against the\nfastest mpi4py "
          "variant that, like tfring, writes a separate output.")


def main():
    args = parse_args()
    if args.intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads)
    comm = MPI.COMM_WORLD
    hvd.init()
    rank0 = hvd.rank() == 0
    if rank0:
        print(f"tfring allreduce benchmark: {hvd.size()} ranks on "
              f"{socket.gethostname()} ({os.cpu_count()} cores), "
              f"TensorFlow {tf.__version__}, "
              f"{MPI.Get_library_version().split(',')[0].strip()}")
        print(f"repeats {args.repeats}, latency repeats "
              f"{args.latency_repeats}, intra-op threads "
              f"{args.intra_op_threads or 'TF default'}")
        print("tfring configuration:")
        for entry in tfring._core.config():
            mark = "" if entry["value"] == entry["default"] else \
                f"  (default {entry['default']})"
            print(f"  {entry['env']}={entry['value']}{mark}")
        print(flush=True)

    started = time.perf_counter()
    results = []
    for num_bytes in SIZES:
        variants = single_tensor_variants(comm, num_bytes)
        results.append((describe_size(num_bytes),
                        measure(comm, variants, args.repeats)))
        del variants

    shapes = resnet50_shapes()
    variants = resnet50_variants(comm, shapes)
    case = f"ResNet-50 x{len(shapes)}"
    results.append((case, measure(comm, variants, args.repeats)))
    del variants

    latency = single_tensor_variants(comm, 4 * KIB)
    results.append(("4 KiB latency", measure(comm, latency,
                                             args.latency_repeats)))

    if rank0:
        values = sum(int(np.prod(s)) for s in shapes)
        print(f"ResNet-50 set: {len(shapes)} float32 tensors, {values:,} "
              f"values ({values * 4 / MIB:.1f} MiB)\n")
        print_table(results)
        print("\n4 KiB latency percentiles in ms (p10 / p50 / p90 / p99):")
        for label, t in results[-1][1].items():
            p = np.percentile(t, [10, 50, 90, 99]) * 1e3
            print(f"  {label:<44} " + " / ".join(f"{x:.3f}" for x in p))
        print(f"\nmeasured in {time.perf_counter() - started:.0f} s",
              flush=True)
    # Keep every rank alive until rank 0 has printed.
    comm.Barrier()


if __name__ == "__main__":
    main()
