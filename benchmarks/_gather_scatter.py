"""The allgather, alltoall and reducescatter cases of benchmarks/allreduce.py.

Each function returns the variants of one case ({label: fn}, for
_timing.measure) after running every variant once, outside timing, and
checking its result: the mpi4py variants against values rebuilt from every
rank's inputs (_timing.rank_data), tfring's against the mpi4py result. All
data is float32; buffers are allocated here, never while timed.
"""

import numpy as np
from mpi4py import MPI
import tensorflow as tf

import tfring as hvd
from _timing import check, rank_data


def _layout(comm, count):
    """size, rank, and the per-rank counts and displacements of `count`
    elements split evenly (for the v-variants of MPI)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    block = count // size
    return size, rank, [block] * size, [r * block for r in range(size)]


def allgather_variants(comm, total_bytes):
    """One tensor; the gathered output has total_bytes (each rank gives
    1/size of it, rounded down to whole elements)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    per_rank = total_bytes // 4 // size
    _, _, counts, displs = _layout(comm, per_rank * size)
    src = rank_data(rank, per_rank)
    expected = np.concatenate([rank_data(r, per_rank) for r in range(size)])
    dst, dst_v = np.empty_like(expected), np.empty_like(expected)
    # In place, this rank's part already lies in its slot of the output.
    in_place = np.empty_like(expected)
    in_place[rank * per_rank:(rank + 1) * per_rank] = src
    tensor = tf.constant(src)

    @tf.function
    def gather_in_function(x):
        return hvd.allgather(x)

    variants = {
        "mpi4py Allgather src->dst": lambda: comm.Allgather(src, dst),
        "mpi4py Allgatherv src->dst":
            lambda: comm.Allgatherv(src, [dst_v, counts, displs, MPI.FLOAT]),
        "mpi4py Allgather in place":
            lambda: comm.Allgather(MPI.IN_PLACE, in_place),
        "tfring allgather eager": lambda: hvd.allgather(tensor),
        "tfring allgather tf.function": lambda: gather_in_function(tensor),
    }
    for label in list(variants)[:3]:
        variants[label]()
    for label, got in [("Allgather", dst), ("Allgatherv", dst_v),
                       ("Allgather in place", in_place)]:
        check(f"mpi4py {label}", got, expected)
    check("tfring allgather eager", hvd.allgather(tensor), dst)
    check("tfring allgather tf.function", gather_in_function(tensor), dst)
    return variants


def many_allgather_variants(comm, count, tensor_bytes):
    """`count` tensors of tensor_bytes per rank gathered in one step."""
    size, rank = comm.Get_size(), comm.Get_rank()
    k = tensor_bytes // 4
    srcs = [a.copy() for a in rank_data(rank, (count, k))]
    # Output i is every rank's tensor i, in rank order.
    expected = np.stack([rank_data(r, (count, k)) for r in range(size)],
                        axis=1).reshape(count, size * k)
    dsts = np.empty((count, size * k), np.float32)
    in_place = np.empty((count, size * k), np.float32)
    for i, s in enumerate(srcs):
        in_place[i, rank * k:(rank + 1) * k] = s
    # Packed: rank r's tensors land in gathered[r]; this rank packs its own
    # straight into its slot, so the Allgather itself runs in place.
    gathered = np.empty((size, count, k), np.float32)
    unpacked = np.empty((count, size, k), np.float32)
    tensors = [tf.constant(s) for s in srcs]

    def per_tensor():
        for s, d in zip(srcs, dsts):
            comm.Allgather(s, d)

    def per_tensor_in_place():
        for d in in_place:
            comm.Allgather(MPI.IN_PLACE, d)

    def pack_gather_unpack():
        own = gathered[rank]
        for i, s in enumerate(srcs):
            np.copyto(own[i], s)
        comm.Allgather(MPI.IN_PLACE, gathered)
        np.copyto(unpacked, gathered.transpose(1, 0, 2))  # one strided copy

    @tf.function
    def grouped(ts):
        return hvd.grouped_allgather(ts)

    @tf.function
    def one_op_per_tensor(ts):
        return [hvd.allgather(t) for t in ts]

    variants = {
        "mpi4py one Allgather per tensor src->dst": per_tensor,
        "mpi4py one Allgather per tensor in place": per_tensor_in_place,
        "mpi4py packed: copy in, Allgather, copy out": pack_gather_unpack,
        "tfring grouped_allgather eager":
            lambda: hvd.grouped_allgather(tensors),
        "tfring grouped_allgather tf.function": lambda: grouped(tensors),
        "tfring allgather per tensor tf.function":
            lambda: one_op_per_tensor(tensors),
    }
    per_tensor()
    per_tensor_in_place()
    pack_gather_unpack()
    check("mpi4py per tensor", dsts, expected)
    check("mpi4py per tensor in place", in_place, expected)
    check("mpi4py packed", unpacked.reshape(count, size * k), expected)
    for label, results in [
            ("tfring grouped eager", hvd.grouped_allgather(tensors)),
            ("tfring grouped tf.function", grouped(tensors)),
            ("tfring per tensor tf.function", one_op_per_tensor(tensors))]:
        check(label, np.stack([np.asarray(r) for r in results]), dsts)
    return variants


def alltoall_variants(comm, num_bytes):
    """One tensor of num_bytes per rank (rounded down to a multiple of size
    elements), split evenly: block j goes to rank j."""
    size, rank = comm.Get_size(), comm.Get_rank()
    count = num_bytes // 4 // size * size
    _, _, counts, displs = _layout(comm, count)
    block = count // size
    src = rank_data(rank, count)
    expected = np.concatenate([rank_data(r, count)[rank * block:
                                                   (rank + 1) * block]
                               for r in range(size)])
    dst, dst_v = np.empty_like(src), np.empty_like(src)
    # Repeated in-place calls keep permuting the same values: harmless.
    in_place = src.copy()
    tensor = tf.constant(src)

    @tf.function
    def alltoall_in_function(x):
        return hvd.alltoall(x)

    variants = {
        "mpi4py Alltoall src->dst": lambda: comm.Alltoall(src, dst),
        "mpi4py Alltoallv src->dst": lambda: comm.Alltoallv(
            [src, counts, displs, MPI.FLOAT],
            [dst_v, counts, displs, MPI.FLOAT]),
        "mpi4py Alltoall in place":
            lambda: comm.Alltoall(MPI.IN_PLACE, in_place),
        "tfring alltoall eager": lambda: hvd.alltoall(tensor),
        "tfring alltoall tf.function": lambda: alltoall_in_function(tensor),
    }
    for label in list(variants)[:3]:
        variants[label]()
    for label, got in [("Alltoall", dst), ("Alltoallv", dst_v),
                       ("Alltoall in place", in_place)]:
        check(f"mpi4py {label}", got, expected)
    check("tfring alltoall eager", hvd.alltoall(tensor), dst)
    check("tfring alltoall tf.function", alltoall_in_function(tensor), dst)
    return variants


def reducescatter_variants(comm, num_bytes):
    """One input tensor of num_bytes (rounded down to a multiple of size
    elements), summed; rank r keeps block r."""
    size, rank = comm.Get_size(), comm.Get_rank()
    count = num_bytes // 4 // size * size
    _, _, counts, _ = _layout(comm, count)
    block = count // size
    src = rank_data(rank, count)
    expected = sum(rank_data(r, count)
                   for r in range(size))[rank * block:(rank + 1) * block]
    dst_block, dst = np.empty(block, np.float32), np.empty(block, np.float32)
    # In place, MPI reads the whole input from the output buffer and leaves
    # the result at its start. Zeros keep repeated sums from growing (they
    # are set after the check below).
    in_place_block, in_place = src.copy(), src.copy()
    tensor = tf.constant(src)

    @tf.function
    def reducescatter_in_function(x):
        return hvd.reducescatter(x, op=hvd.Sum)

    variants = {
        "mpi4py Reduce_scatter_block src->dst":
            lambda: comm.Reduce_scatter_block(src, dst_block, op=MPI.SUM),
        "mpi4py Reduce_scatter src->dst":
            lambda: comm.Reduce_scatter(src, dst, counts, op=MPI.SUM),
        "mpi4py Reduce_scatter_block in place":
            lambda: comm.Reduce_scatter_block(MPI.IN_PLACE, in_place_block,
                                              op=MPI.SUM),
        "mpi4py Reduce_scatter in place":
            lambda: comm.Reduce_scatter(MPI.IN_PLACE, in_place, counts,
                                        op=MPI.SUM),
        "tfring reducescatter eager":
            lambda: hvd.reducescatter(tensor, op=hvd.Sum),
        "tfring reducescatter tf.function":
            lambda: reducescatter_in_function(tensor),
    }
    for label in list(variants)[:4]:
        variants[label]()
    for label, got in [("Reduce_scatter_block", dst_block),
                       ("Reduce_scatter", dst),
                       ("Reduce_scatter_block in place",
                        in_place_block[:block]),
                       ("Reduce_scatter in place", in_place[:block])]:
        check(f"mpi4py {label}", got, expected)
    in_place_block.fill(0)
    in_place.fill(0)
    check("tfring reducescatter eager", hvd.reducescatter(tensor, op=hvd.Sum),
          dst)
    check("tfring reducescatter tf.function",
          reducescatter_in_function(tensor), dst)
    return variants


def many_reducescatter_variants(comm, count, tensor_bytes):
    """`count` input tensors of tensor_bytes (rounded down to a multiple of
    size elements) per rank, summed and scattered in one step."""
    size, rank = comm.Get_size(), comm.Get_rank()
    k = tensor_bytes // 4 // size * size
    blk = k // size
    srcs = [a.copy() for a in rank_data(rank, (count, k))]
    expected = sum(rank_data(r, (count, k))
                   for r in range(size))[:, rank * blk:(rank + 1) * blk]
    dsts = np.empty((count, blk), np.float32)
    in_place = np.array(srcs)  # zeroed after the check below
    # Packed: packed[r, i] is block r of tensor i, so one Reduce_scatter
    # leaves this rank block `rank` of every tensor, in tensor order. The
    # copy out gives results that outlive the next call, as tfring's do.
    packed = np.empty((size, count, blk), np.float32)
    received = np.empty((count, blk), np.float32)
    unpacked = np.empty((count, blk), np.float32)
    tensors = [tf.constant(s) for s in srcs]

    def per_tensor():
        for s, d in zip(srcs, dsts):
            comm.Reduce_scatter_block(s, d, op=MPI.SUM)

    def per_tensor_in_place():
        for b in in_place:
            comm.Reduce_scatter_block(MPI.IN_PLACE, b, op=MPI.SUM)

    def pack_reduce_unpack():
        for i, s in enumerate(srcs):
            np.copyto(packed[:, i], s.reshape(size, blk))
        comm.Reduce_scatter_block(packed, received, op=MPI.SUM)
        np.copyto(unpacked, received)

    @tf.function
    def grouped(ts):
        return hvd.grouped_reducescatter(ts, op=hvd.Sum)

    @tf.function
    def one_op_per_tensor(ts):
        return [hvd.reducescatter(t, op=hvd.Sum) for t in ts]

    variants = {
        "mpi4py Reduce_scatter_block per tensor src->dst": per_tensor,
        "mpi4py Reduce_scatter_block per tensor in place":
            per_tensor_in_place,
        "mpi4py packed: copy in, Reduce_scatter_block, copy out":
            pack_reduce_unpack,
        "tfring grouped_reducescatter eager":
            lambda: hvd.grouped_reducescatter(tensors, op=hvd.Sum),
        "tfring grouped_reducescatter tf.function": lambda: grouped(tensors),
        "tfring reducescatter per tensor tf.function":
            lambda: one_op_per_tensor(tensors),
    }
    per_tensor()
    per_tensor_in_place()
    pack_reduce_unpack()
    check("mpi4py per tensor", dsts, expected)
    check("mpi4py per tensor in place", in_place[:, :blk], expected)
    check("mpi4py packed", unpacked, expected)
    in_place.fill(0)
    for label, results in [
            ("tfring grouped eager",
             hvd.grouped_reducescatter(tensors, op=hvd.Sum)),
            ("tfring grouped tf.function", grouped(tensors)),
            ("tfring per tensor tf.function", one_op_per_tensor(tensors))]:
        check(label, np.stack([np.asarray(r) for r in results]), dsts)
    return variants
