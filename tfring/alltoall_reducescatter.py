# alltoall, reducescatter, grouped_reducescatter and grouped_allgather: the
# collectives that share dimension 0 out between the ranks, with Horovod's
# signatures and defaults.
#
# Why a module of their own: collectives.py holds the reductions and
# gathers every rank receives whole; these split or redistribute rows, and
# their checks (splits, an op reducescatter implements) are theirs alone.
# Like collectives.py, this layer validates what one rank can get wrong on
# its own before any C++ runs; what needs every rank's view (shapes, splits
# that do not add up on some rank) is checked by the core on every rank.

import numpy as np
import tensorflow as tf

from tfring import basics
from tfring import collectives
from tfring import list_agreement
from tfring import errors
from tfring import ops as _ops
from tfring.compression import Compression
from tfring.process_sets import global_process_set

_do_not_convert = tf.autograph.experimental.do_not_convert

REDUCESCATTER_OPS = (int(collectives.Sum), int(collectives.Average))


def _check_not_slices(tensor, api_name):
    if isinstance(tensor, tf.IndexedSlices):
        raise TypeError(
            f"{api_name} received a tf.IndexedSlices. Expected a dense "
            "tensor. Convert it first with tf.convert_to_tensor(slices).")


def _check_tensor_list(tensors, api_name, single):
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(
            f"{api_name} received a {type(tensors).__name__}. Expected a list "
            f"or tuple of tensors. Pass a list, or use {single} for one "
            "tensor.")


def _splits_tensor(splits, api_name):
    """`splits` as the int32 vector the op takes (empty: split evenly)."""
    if splits is None:
        return tf.constant([], dtype=tf.int32)
    if isinstance(splits, (tf.Tensor, tf.Variable)):
        if not splits.dtype.is_integer:
            raise TypeError(
                f"{api_name} received splits of dtype {splits.dtype.name}. "
                "Expected integers (rows sent to each rank). Pass an int32 "
                "or int64 tensor, or a list of ints.")
        return tf.reshape(tf.cast(splits, tf.int32), [-1])
    values = np.asarray(splits)
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise TypeError(
            f"{api_name} received splits={splits!r}. Expected integers "
            "(rows sent to each rank, one entry per rank). Pass a list of "
            "ints, e.g. splits=[2, 1].")
    return tf.constant(values.reshape([-1]).astype(np.int32), dtype=tf.int32)


@_do_not_convert
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends rows of dimension 0 to every rank and receives theirs.

    Rank i sends `splits[j]` consecutive rows to rank j, in rank order; each
    rank returns the rows it received, concatenated in rank order. With
    `splits=None` dimension 0 is split evenly (it must divide by size()).
    Dimension 0 may differ between ranks; the other dimensions and the
    dtype must match. With `process_set`, only its ranks take part (and may
    call this): `splits` has one entry per rank of the set, in the order of
    their job ranks, and dimension 0 is split by the set's size.
    `ignore_name_scope` is accepted for Horovod compatibility; tfring's
    names do not depend on name scopes.

    Returns:
      The received tensor; with `splits` given, `(tensor, received_splits)`,
      received_splits an int32 vector of the rows that came from each rank.
    """
    del ignore_name_scope  # names never include the name scope
    api_name = "tfring.alltoall()"
    basics._check_initialized(api_name)
    membership = collectives.resolve_process_set(process_set, api_name)
    _check_not_slices(tensor, api_name)
    tensor = tf.convert_to_tensor(tensor)
    collectives.check_dtype(tensor, collectives.GATHER_BROADCAST_DTYPES,
                            api_name, name)
    output, received_splits = _ops.alltoall_op(
        tensor, _splits_tensor(splits, api_name), name=name,
        process_set_id=membership.id)
    return output if splits is None else (output, received_splits)


def _reducescatter_op(op, api_name):
    """The op value, which must be one reducescatter implements."""
    op = collectives.reduce_op_value(op, api_name)
    if op not in REDUCESCATTER_OPS:
        raise errors.UnsupportedOperationError(
            f"{api_name} received op=tfring.{collectives.reduce_op_name(op)}. "
            "Expected tfring.Sum or tfring.Average (the ops reducescatter "
            "implements, as in Horovod). Use allreduce() for Min, Max or "
            "Product.")
    return op


def _check_reducescatter_args(op, prescale_factor, postscale_factor,
                              process_set, api_name):
    """What every reducescatter entry point validates first: the op value,
    the scale factors as floats, and the process set's membership."""
    op = _reducescatter_op(op, api_name)
    basics._check_initialized(api_name)
    prescale_factor = collectives.check_scale_factor(
        prescale_factor, "prescale_factor", api_name)
    postscale_factor = collectives.check_scale_factor(
        postscale_factor, "postscale_factor", api_name)
    membership = collectives.resolve_process_set(process_set, api_name)
    return op, prescale_factor, postscale_factor, membership


def _prepare_reducescatter_input(tensor, api_name, name=None):
    _check_not_slices(tensor, api_name)
    tensor = tf.convert_to_tensor(tensor)
    collectives.check_dtype(tensor, collectives.ALLREDUCE_DTYPES, api_name,
                            name)
    return tensor


def _reducescatter_one(tensor, op, prescale_factor, postscale_factor,
                       compression, name, membership):
    return collectives.compressed_collective(
        compression, tensor,
        lambda compressed: _ops.reducescatter_op(
            compressed, op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, name=name,
            process_set_id=membership.id))


@_do_not_convert
def reducescatter(tensor, device_dense='', compression=Compression.none,
                  op=collectives.Average, name=None,
                  process_set=global_process_set, *,
                  ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces `tensor` over all ranks; rank i keeps block i of dimension 0.

    The shape and dtype must match on every rank, with at least one
    dimension. When dimension 0 does not divide by size(), the first
    `dim0 % size()` ranks get one extra row (Horovod's rule). `op` is
    Average (default) or Sum; integer Average truncates toward zero.
    `prescale_factor` and `postscale_factor` multiply the input before and
    the result after the reduction. With `process_set`, only its ranks take
    part (and may call this), Average divides by the set's size, and the
    i-th rank of the set (process_set.rank() == i) keeps block i.
    """
    del ignore_name_scope  # names never include the name scope
    api_name = "tfring.reducescatter()"
    op, prescale_factor, postscale_factor, membership = (
        _check_reducescatter_args(op, prescale_factor, postscale_factor,
                                  process_set, api_name))
    tensor = _prepare_reducescatter_input(tensor, api_name, name)
    with tf.device(device_dense):
        return _reducescatter_one(tensor, op, prescale_factor,
                                  postscale_factor, compression, name,
                                  membership)


@_do_not_convert
def grouped_reducescatter(tensors, device_dense='',
                          compression=Compression.none,
                          op=collectives.Average,
                          process_set=global_process_set, *,
                          prescale_factor=1.0, postscale_factor=1.0,
                          name=None):
    """reducescatter() of a list of tensors, submitted and fused together.

    Same arguments as reducescatter() (applied to every tensor); dtypes may
    differ between the tensors. Tensor i is named `<name>.<i>` when `name`
    is given (tfring's addition: what tells apart groups that run at the
    same time). Returns a list in the order of `tensors`.
    """
    api_name = "tfring.grouped_reducescatter()"
    _check_tensor_list(tensors, api_name, "tfring.reducescatter()")
    op, prescale_factor, postscale_factor, membership = (
        _check_reducescatter_args(op, prescale_factor, postscale_factor,
                                  process_set, api_name))
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{api_name} received name={name!r}. Expected a str "
                        "or None.")
    list_agreement.check_same_length_once(
        ("reducescatter", name, membership.key), tensors, "tensors",
        "reduce-scatter", api_name, membership, name)
    if not tensors:
        return []
    tensors = [_prepare_reducescatter_input(t, api_name) for t in tensors]

    def body(group):
        with tf.device(device_dense):
            return [_reducescatter_one(
                t, op, prescale_factor, postscale_factor, compression,
                None if name is None else f"{name}.{i}", membership)
                for i, t in enumerate(group)]

    key = ("reducescatter", op, prescale_factor, postscale_factor,
           compression, device_dense, name, membership.key)
    return collectives.run_grouped(key, body, tensors)


@_do_not_convert
def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """allgather() of a list of tensors, submitted and fused together.

    Each tensor follows allgather()'s rules (dimension 0 may differ between
    ranks; with `process_set`, only its ranks take part); dtypes may differ
    between the tensors. Returns a list in the order of `tensors`.
    """
    del ignore_name_scope  # names never include the name scope
    api_name = "tfring.grouped_allgather()"
    _check_tensor_list(tensors, api_name, "tfring.allgather()")
    basics._check_initialized(api_name)
    membership = collectives.resolve_process_set(process_set, api_name)
    list_agreement.check_same_length_once(
        ("allgather", name, membership.key), tensors, "tensors", "gather",
        api_name, membership, name)
    if not tensors:
        return []
    prepared = []
    for t in tensors:
        _check_not_slices(t, api_name)
        t = tf.convert_to_tensor(t)
        collectives.check_dtype(t, collectives.GATHER_BROADCAST_DTYPES,
                                api_name, name)
        prepared.append(t)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{api_name} received name={name!r}. Expected a str "
                        "or None.")

    def body(group):
        return [_ops.allgather_op(
            t, name=None if name is None else f"{name}.{i}",
            process_set_id=membership.id)
            for i, t in enumerate(group)]

    return collectives.run_grouped(("allgather", name, membership.key), body,
                                   prepared)

