"""tfring collectives vs raw MPI (mpi4py) on the same buffers, in one job.

    tfringrun -np 2 python benchmarks/allreduce.py [--repeats 20]
        [--cases allreduce,allgather,alltoall,reducescatter]

--cases picks the case groups to run (comma-separated; default all); a run
of one group is much shorter. The groups and their cases (float32 data):

allreduce
  * one tensor of 4 KiB, 256 KiB, 4 MiB and 64 MiB: mpi4py Allreduce in
    place and out of place vs tfring allreduce(op=Sum) eagerly and inside a
    tf.function on a tensor held elsewhere (so tfring writes a separate
    output), and, from 4 MiB, inside a tf.function on a fresh input, made
    by a multiply in the same function as a gradient would be (tfring
    reduces it in place; the multiply is timed alone in the same
    repetitions and subtracted: "tfring allreduce tf.function, fresh
    input");
  * the ResNet-50 gradient set (the shapes of ResNet50(weights=None)'s
    trainable variables): tfring in one tf.function (grouped_allreduce, and
    one allreduce per tensor) vs mpi4py one Allreduce per tensor vs mpi4py
    one Allreduce of all tensors packed into one buffer (pack and unpack
    copies included); and tfring on fresh inputs, as gradients are in
    training (nothing else holds them, so tfring reduces them in place):
    they are made inside the function by a multiply, which is also timed
    alone in the same repetitions and subtracted (the row "tfring
    grouped_allreduce, fresh inputs");
  * the latency of a lone 4 KiB allreduce, over many repetitions, next to
    TensorFlow's own floor: the same tf.function call with a multiply
    instead of the allreduce, and with the multiply's result passed through
    a FIFOQueue (whose dequeue is an asynchronous kernel, as tfring's ops
    are); once with the variants interleaved call by
    call, once in runs of LOOP_RUN_LENGTH calls of each variant, as a loop
    calls one op after another ("4 KiB latency in loops").
allgather
  * one tensor, 4 KiB, 4 MiB and 64 MiB of output (each rank gives
    1/size): mpi4py Allgather and Allgatherv into a preallocated output, and
    Allgather in place (this rank's part already in its output slot), vs
    tfring allgather eagerly and inside a tf.function;
  * 100 tensors of 1 KiB per rank in one step: mpi4py one Allgather per
    tensor (src->dst and in place), and one Allgather of all of them packed
    (each tensor copied into this rank's slot of one buffer, an in-place
    Allgather, one strided copy out to per-tensor outputs), vs tfring
    grouped_allgather (eager, which tfring runs as one tf.function, and in a
    tf.function) and one allgather per tensor in one tf.function.
alltoall
  * one tensor of 4 KiB, 4 MiB and 64 MiB per rank, split evenly: mpi4py
    Alltoall and Alltoallv (counts and displacements) into a preallocated
    output, and Alltoall in place, vs tfring alltoall eagerly and inside a
    tf.function.
reducescatter
  * one input of 4 KiB, 4 MiB and 64 MiB, summed: mpi4py
    Reduce_scatter_block and Reduce_scatter (recvcounts) into a preallocated
    output and both in place (MPI.IN_PLACE), vs tfring reducescatter(op=Sum)
    eagerly and inside a tf.function;
  * 100 inputs of 1 KiB per rank in one step: mpi4py one
    Reduce_scatter_block per tensor (src->dst and in place), and one of all
    of them packed (block r of every tensor copied to part r of one buffer,
    one Reduce_scatter_block, a copy out), vs tfring grouped_reducescatter
    (eager and in a tf.function) and one reducescatter per tensor in one
    tf.function.
Sizes that do not divide by the number of ranks are rounded down to whole
elements per rank.

Method: all variants of a case run interleaved, repetition by repetition (in
a rotating order), so drift of the machine affects them alike. Every timed
repetition starts after comm.Barrier(); its time is the slowest rank's. Each
variant runs twice untimed first (tracing, negotiation, first allocations).
Before that, every variant's result is checked once, outside timing
(mpi4py's against the expected values, tfring's against mpi4py's), so a
broken op cannot be timed unnoticed. Rank 0 prints median and min in ms, and
for tfring the ratio to the best MPI variant of the case (median/median and
min/min; below 1 means tfring wins) and to the best MPI variant that writes
a separate output as tfring does. Helpers live in benchmarks/_timing.py and
benchmarks/_gather_scatter.py (imported from this script's directory).
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

# Helpers next to this script (its directory is first on sys.path).
import _gather_scatter as gs  # noqa: E402
from _timing import (KIB, MIB, check, describe_size, measure,  # noqa: E402
                     print_table, private_array)

CASE_GROUPS = ("allreduce", "allgather", "alltoall", "reducescatter")
SIZES = (4 * KIB, 256 * KIB, 4 * MIB, 64 * MIB)
# The lone 4 KiB allreduce again, each variant called this many times in a
# row (each call timed alone, after a barrier) before the next one's turn,
# as a loop calls the same op: the case above interleaves the variants call
# by call, so each call starts with the other variants' code and data in the
# caches.
LOOP_CASE = "4 KiB latency in loops"
LOOP_RUN_LENGTH = 10
SHARD_SIZES = (4 * KIB, 4 * MIB, 64 * MIB)  # allgather, alltoall, ...
SMALL_COUNT, SMALL_BYTES = 100, 1 * KIB  # the many-small-tensors cases
RESNET50_TENSORS = 214
RESNET50_VALUES = 25_583_592


def case_groups(text):
    groups = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in groups if g not in CASE_GROUPS]
    if unknown or not groups:
        raise argparse.ArgumentTypeError(
            f"unknown case group(s) {unknown or text!r}; expected a "
            f"comma-separated subset of {','.join(CASE_GROUPS)}")
    return [g for g in CASE_GROUPS if g in groups]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed repetitions per variant (default 20)")
    parser.add_argument("--latency-repeats", type=int, default=500,
                        help="timed repetitions of the lone 4 KiB allreduce")
    parser.add_argument("--cases", type=case_groups,
                        default=list(CASE_GROUPS),
                        help="case groups to run, comma-separated (default "
                             f"all: {','.join(CASE_GROUPS)})")
    parser.add_argument("--intra-op-threads", type=int, default=1,
                        help="TensorFlow intra-op threads per rank (default "
                             "1; 0 for TensorFlow's default)")
    return parser.parse_args()


def single_tensor_variants(comm, num_bytes, with_floor=False,
                           with_fresh=False):
    """mpi4py and tfring variants reducing one float32 tensor of num_bytes;
    with_floor adds TensorFlow's own cost of calling a tf.function on it,
    with_fresh tfring on a fresh input (FRESH_LABELS)."""
    count = num_bytes // 4
    # Values every rank can sum exactly; the in-place buffer stays zero so
    # repeated in-place sums never grow.
    src = private_array(count, fill=comm.Get_rank() + 1)
    dst = private_array(count)
    in_place = private_array(count)
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
    if with_floor:
        @tf.function
        def scale_in_function(x):
            return x * 2.0

        queue = tf.queue.FIFOQueue(2, tf.float32, shapes=[tensor.shape])

        @tf.function
        def through_queue_in_function(x):
            queue.enqueue(x * 2.0)
            return queue.dequeue()

        variants[FLOOR_LABEL] = lambda: scale_in_function(tensor)
        variants[ASYNC_FLOOR_LABEL] = lambda: through_queue_in_function(tensor)
    if with_fresh:
        fresh, reduce_fresh = fresh_variants(
            lambda x: hvd.allreduce(x, op=hvd.Sum), tensor, "single")
        variants.update(fresh)
        check("tfring fresh", reduce_fresh(tensor), expected)
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
    srcs = [private_array(s, fill=value) for s in shapes]
    dsts = [private_array(s) for s in shapes]
    in_place = [private_array(s) for s in shapes]
    tensors = [tf.constant(a) for a in srcs]
    packed = private_array(sum(a.size for a in srcs))
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

    fresh, grouped_fresh = fresh_variants(
        lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum), tensors, "grouped")
    variants = {
        "mpi4py one Allreduce per tensor src->dst": lambda: per_tensor(dsts),
        "mpi4py one Allreduce per tensor in place": per_tensor_in_place,
        "mpi4py packed: copy in, Allreduce, copy out": pack_reduce_unpack,
        "tfring grouped_allreduce tf.function": lambda: grouped(tensors),
        "tfring allreduce per tensor tf.function":
            lambda: one_op_per_tensor(tensors),
        **fresh,
    }
    for label, results in [("tfring grouped", grouped(tensors)),
                           ("tfring grouped fresh", grouped_fresh(tensors)),
                           ("tfring per tensor", one_op_per_tensor(tensors))]:
        for r in (results[0], results[-1], results[len(results) // 2]):
            check(label, r, np.full(r.shape, expected_value, np.float32))
    pack_reduce_unpack()
    check("mpi4py packed", dsts[0], np.full(shapes[0], expected_value,
                                            np.float32))
    return variants


# TensorFlow's floor for a lone op in a tf.function: the same call with a
# multiply instead of the allreduce (no communication at all).
FLOOR_LABEL = "(TensorFlow alone: tf.function x * 2)"
# The same with an asynchronous kernel of TensorFlow's own, as tfring's
# allreduce is one (the caller waits for its completion): the multiply goes
# through a FIFOQueue (enqueue, then the asynchronous dequeue), still with
# no communication.
ASYNC_FLOOR_LABEL = "(TensorFlow alone: x * 2 through a queue)"
# tfring on fresh inputs: (timed: make + reduce, timed: make alone, the
# reported difference), for a single tensor and for the ResNet-50 set.
FRESH_LABELS = {
    "single": ("(making a fresh input + tfring allreduce)",
               "(making a fresh input alone)",
               "tfring allreduce tf.function, fresh input"),
    "grouped": ("(making fresh inputs + tfring grouped)",
                "(making fresh inputs alone)",
                "tfring grouped_allreduce, fresh inputs"),
}


def fresh_variants(reduce, inputs, kind):
    """tfring on fresh inputs, as gradients are in training: nothing else
    holds them, so tfring reduces them in place. `inputs` (a tensor or a
    list) are made fresh by a multiply inside a tf.function and passed to
    `reduce`; the same multiply alone is timed too, and add_fresh_difference
    reports the difference per repetition. Returns the two variants
    (labelled by FRESH_LABELS[kind]) and the reducing function."""
    one = tf.Variable(1.0)

    @tf.function
    def make_fresh(xs):
        return tf.nest.map_structure(lambda x: x * one, xs)

    @tf.function
    def reduce_fresh(xs):
        return reduce(make_fresh(xs))

    total_label, make_label, _ = FRESH_LABELS[kind]
    return ({total_label: lambda: reduce_fresh(inputs),
             make_label: lambda: make_fresh(inputs)}, reduce_fresh)


def add_fresh_difference(times):
    """tfring's time on fresh inputs, where the case has it: per
    repetition, (make + reduce) - (make alone), both timed in the same
    repetition."""
    for total_label, make_label, label in FRESH_LABELS.values():
        if total_label in times:
            total = np.asarray(times.pop(total_label))
            make = np.asarray(times[make_label])
            times[label] = np.maximum(total - make, 0.0)


def main():
    args = parse_args()
    if args.intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads)
    comm = MPI.COMM_WORLD
    hvd.init()
    rank0 = hvd.rank() == 0
    if rank0:
        print(f"tfring collectives benchmark: {hvd.size()} ranks on "
              f"{socket.gethostname()} ({os.cpu_count()} cores), "
              f"TensorFlow {tf.__version__}, "
              f"{MPI.Get_library_version().split(',')[0].strip()}")
        print(f"cases {','.join(args.cases)}; repeats {args.repeats}, "
              f"latency repeats {args.latency_repeats}, intra-op threads "
              f"{args.intra_op_threads or 'TF default'}")
        print("tfring configuration:")
        for entry in tfring._core.config():
            mark = "" if entry["value"] == entry["default"] else \
                f"  (default {entry['default']})"
            print(f"  {entry['env']}={entry['value']}{mark}")
        print(flush=True)

    started = time.perf_counter()
    results, latencies, shapes = [], [], None

    def run(case, variants, repeats=args.repeats, run_length=1):
        results.append((case, measure(comm, variants, repeats, run_length)))
        return results[-1][1]

    if "allreduce" in args.cases:
        for num_bytes in SIZES:
            add_fresh_difference(run(
                f"allreduce {describe_size(num_bytes)}",
                single_tensor_variants(comm, num_bytes,
                                       with_fresh=num_bytes >= MIB)))
        shapes = resnet50_shapes()
        add_fresh_difference(
            run(f"ResNet-50 x{len(shapes)}", resnet50_variants(comm, shapes)))
        latency_variants = single_tensor_variants(comm, 4 * KIB,
                                                  with_floor=True)
        latencies.append(("4 KiB latency", run(
            "4 KiB latency", latency_variants, args.latency_repeats)))
        latencies.append((LOOP_CASE, run(
            LOOP_CASE, latency_variants, args.latency_repeats,
            run_length=LOOP_RUN_LENGTH)))
    small = f"{SMALL_COUNT}x{describe_size(SMALL_BYTES)}"
    if "allgather" in args.cases:
        for num_bytes in SHARD_SIZES:
            run(f"allgather {describe_size(num_bytes)}",
                gs.allgather_variants(comm, num_bytes))
        run(f"allgather {small}",
            gs.many_allgather_variants(comm, SMALL_COUNT, SMALL_BYTES))
    if "alltoall" in args.cases:
        for num_bytes in SHARD_SIZES:
            run(f"alltoall {describe_size(num_bytes)}",
                gs.alltoall_variants(comm, num_bytes))
    if "reducescatter" in args.cases:
        for num_bytes in SHARD_SIZES:
            run(f"reducescatter {describe_size(num_bytes)}",
                gs.reducescatter_variants(comm, num_bytes))
        run(f"reducescatter {small}",
            gs.many_reducescatter_variants(comm, SMALL_COUNT, SMALL_BYTES))

    if rank0:
        if shapes is not None:
            values = sum(int(np.prod(s)) for s in shapes)
            print(f"ResNet-50 set: {len(shapes)} float32 tensors, "
                  f"{values:,} values ({values * 4 / MIB:.1f} MiB)\n")
        print_table(results)
        for case, latency in latencies:
            print(f"\n{case} percentiles in ms (p10 / p50 / p90 / p99):")
            for label, t in latency.items():
                p = np.percentile(t, [10, 50, 90, 99]) * 1e3
                print(f"  {label:<44} " + " / ".join(f"{x:.3f}" for x in p))
        print(f"\nmeasured in {time.perf_counter() - started:.0f} s",
              flush=True)
    # Keep every rank alive until rank 0 has printed.
    comm.Barrier()


if __name__ == "__main__":
    main()
