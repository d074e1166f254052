# allreduce, grouped_allreduce, allgather and broadcast: the Python face of the
# collectives, with Horovod's signatures and defaults.
#
# Why this layer exists: it is thin but strict. Everything a user can get
# wrong on one rank alone (not initialized, an unknown or unsupported op, a
# dtype the core cannot reduce, a root_rank outside [0, size) or outside the
# process set, a bad scale factor, a process set that is not registered or
# does not contain this rank) is caught here, before any C++ runs, with a
# message that says how to fix it. What needs every rank's view (shapes, dtypes, ops differing
# across ranks) is the core's job and surfaces as
# tf.errors.FailedPreconditionError. The data itself never passes through
# Python: each function only builds TensorFlow ops from tfring.ops.

import itertools
import os

import tensorflow as tf
from tensorflow.python.eager import record

from tfring import _core
from tfring import basics
from tfring import errors
from tfring import list_agreement
from tfring import ops as _ops
from tfring import process_sets as _process_sets
from tfring.compression import Compression
from tfring.compressors import wire_compression
from tfring.process_sets import global_process_set

# Reduction ops and the argument checks shared with tfring.torch live in
# reduce_args.py (no TensorFlow there); re-exported for this module's users.
from tfring.reduce_args import (  # noqa: E402,F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    _op_names,
    check_root_rank,
    check_scale_factor,
    reduce_op_name,
    reduce_op_value,
    resolve_op,
)

# The public functions are plain graph builders without tensor-dependent
# Python control flow, so AutoGraph need not convert them when they are
# called inside a user's tf.function (converting re-reads their source).
_do_not_convert = tf.autograph.experimental.do_not_convert

# What the op kernels accept (their registered type constraints are the
# authority; tests check that these sets and the kernels agree).
ALLREDUCE_DTYPES = frozenset([
    tf.uint8, tf.int8, tf.int32, tf.int64,
    tf.float16, tf.bfloat16, tf.float32, tf.float64,
])
GATHER_BROADCAST_DTYPES = ALLREDUCE_DTYPES | frozenset(
    [tf.uint16, tf.int16, tf.bool])


def _dtype_names(dtypes):
    return ", ".join(sorted(d.name for d in dtypes))


def _check_reduce_args(op, average, prescale_factor, postscale_factor,
                       api_name):
    """Validates what every allreduce entry point takes; returns the op and
    the two scale factors as floats."""
    op = resolve_op(op, average, api_name)
    basics._check_initialized(api_name)
    return (op,
            check_scale_factor(prescale_factor, "prescale_factor", api_name),
            check_scale_factor(postscale_factor, "postscale_factor", api_name))


def resolve_process_set(process_set, api_name):
    """The Membership of a collective's `process_set` argument (see
    tfring.process_sets.resolve)."""
    return _process_sets.resolve(process_set, api_name)


def _describe(tensor, name):
    if name:
        return f" (tensor '{name}')"
    if not tf.executing_eagerly():
        try:
            return f" (tensor '{tensor.name}')"
        except (AttributeError, ValueError):
            pass
    return ""


def check_dtype(tensor, allowed, api_name, name=None):
    if tensor.dtype.base_dtype not in allowed:
        raise TypeError(
            f"{api_name} received a {tensor.dtype.name} tensor"
            f"{_describe(tensor, name)}, which it does not support. Expected "
            f"one of: {_dtype_names(allowed)}. Cast it first, e.g. "
            "tf.cast(tensor, tf.float32).")


def _check_slices_arguments(op, prescale_factor, postscale_factor, api_name):
    """What Horovod accepts for a tf.IndexedSlices: Sum or Average, no
    scale factors (NotImplementedError otherwise, as in Horovod)."""
    fix = ("Convert it to a dense tensor first with "
           "tf.convert_to_tensor(slices), or pass sparse_as_dense=True to "
           "DistributedGradientTape / DistributedOptimizer.")
    if op not in (int(Sum), int(Average)):
        raise NotImplementedError(
            f"{api_name} received a tf.IndexedSlices with "
            f"op=tfring.{reduce_op_name(op)}. Expected op=tfring.Sum or "
            "tfring.Average for IndexedSlices (they are reduced by gathering "
            f"values and indices). {fix}")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError(
            f"{api_name} received a tf.IndexedSlices with prescale_factor="
            f"{prescale_factor} and postscale_factor={postscale_factor}. "
            "Expected 1.0 for both: IndexedSlices are reduced by gathering "
            "values and indices, which are not scaled (as in Horovod; a "
            "DistributedGradientTape or DistributedOptimizer with "
            "gradient_predivide_factor != 1 passes such factors). Scale the "
            f"values yourself, or reduce densely. {fix}")


def _suffixed(name, suffix):
    return None if name is None else f"{name}_{suffix}"


def _gather_slices(slices, name, device_sparse, membership):
    # A sum of IndexedSlices is the concatenation of every rank's slices
    # (repeated indices add up when the slices are applied or densified).
    with tf.device(device_sparse):
        values = _ops.allgather_op(slices.values,
                                   name=_suffixed(name, "values"),
                                   process_set_id=membership.id)
        indices = _ops.allgather_op(slices.indices,
                                    name=_suffixed(name, "indices"),
                                    process_set_id=membership.id)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def _average_gathered_slices(gathered, op, device_sparse, membership):
    """Average: the gathered values divided by the set's size with
    TensorFlow's `/`, as Horovod does (integer values come back as floating
    point).

    Eager grouped calls divide here, after their tf.function: inside one,
    Grappler turns the division by a constant into a multiplication by its
    reciprocal, which differs from Horovod's eager division in the last bit.
    """
    if op != int(Average):
        return gathered
    with tf.device(device_sparse):
        values = gathered.values / tf.cast(_size_when_run(membership),
                                           gathered.values.dtype)
    return tf.IndexedSlices(values, gathered.indices,
                            dense_shape=gathered.dense_shape)


def _size_when_run(membership):
    """The set's size for a division: in elastic training (where the job's
    size changes under functions traced before) the job's size read when
    the op runs, else the size now."""
    if membership.id == 0 and os.environ.get("TFRING_ELASTIC") == "1":
        return _ops.size_op()
    return membership.size


def _allreduce_slices(slices, op, name, device_sparse, membership):
    return _average_gathered_slices(
        _gather_slices(slices, name, device_sparse, membership), op,
        device_sparse, membership)


def _allreduce_dense(tensor, op, prescale_factor, postscale_factor, name,
                     compression, device_dense, membership, group=None):
    wire = int(wire_compression(compression))
    with tf.device(device_dense):
        return compressed_collective(
            compression, tensor,
            lambda compressed: _ops.allreduce_op(
                compressed, op, prescale_factor=prescale_factor,
                postscale_factor=postscale_factor, name=name,
                process_set_id=membership.id, group=group,
                compression=wire))


def compressed_collective(compression, tensor, collective):
    """collective(tensor) on the wire in `compression`'s format."""
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(collective(compressed), ctx)


def _prepare_reduce_input(tensor, op, prescale_factor, postscale_factor,
                          api_name, name=None):
    """Validated input: an IndexedSlices as it is, anything else a tensor."""
    if isinstance(tensor, tf.IndexedSlices):
        _check_slices_arguments(op, prescale_factor, postscale_factor,
                                api_name)
        check_dtype(tensor.values, ALLREDUCE_DTYPES, api_name, name)
        return tensor
    tensor = tf.convert_to_tensor(tensor)
    check_dtype(tensor, ALLREDUCE_DTYPES, api_name, name)
    return tensor


@_do_not_convert
def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None,
              process_set=global_process_set, ignore_name_scope=False):
    """Reduces `tensor` over all ranks (of `process_set`); every rank gets
    the result.

    Args:
      tensor: a tf.Tensor, tf.Variable, array-like, or tf.IndexedSlices. Its
        shape and dtype must be the same on every rank.
      average: deprecated; use `op`.
      device_dense: device for the dense path ('' leaves placement to
        TensorFlow).
      device_sparse: device for the IndexedSlices path ('' leaves
        placement to TensorFlow).
      compression: Compression.none, Compression.fp16 (a cast to float16
        around the reduction), or Compression.bf16_wire / fp16_wire (the
        core encodes float32 Sum/Average data only where it crosses hosts);
        dense tensors only.
      op: Average (default), Sum, Min, Max or Product. Average is a sum
        scaled by 1/size() (1/process_set.size() in a set); for integer
        dtypes the core rounds the scaled result toward zero.
      prescale_factor: multiplies the input before the reduction (in the
        core, in the tensor's dtype).
      postscale_factor: multiplies the result after the reduction (in the
        core, in the tensor's dtype).
      name: the key that matches this tensor across ranks (optional; see
        "Names" in the collectives guide).
      process_set: the tfring.ProcessSet to reduce over (default: every
        rank). Only its ranks may call this; it raises
        tf.errors.InvalidArgumentError on the others.
      ignore_name_scope: accepted for Horovod compatibility; tfring's names
        never include the name scope.

    Returns:
      A tensor like `tensor` (or a tf.IndexedSlices for IndexedSlices input:
      the values and indices of every rank concatenated, values divided by
      the number of ranks with TensorFlow's `/` for Average, so integer
      values become floating point, as in Horovod; other ops or scale
      factors raise NotImplementedError there).
    """
    del ignore_name_scope  # names never include the name scope
    api_name = "tfring.allreduce()"
    op, prescale_factor, postscale_factor = _check_reduce_args(
        op, average, prescale_factor, postscale_factor, api_name)
    membership = resolve_process_set(process_set, api_name)
    tensor = _prepare_reduce_input(tensor, op, prescale_factor,
                                   postscale_factor, api_name, name)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_slices(tensor, op, name, device_sparse, membership)
    return _allreduce_dense(tensor, op, prescale_factor, postscale_factor,
                            name, compression, device_dense, membership)


# Ids of grouped calls, per process (SubmissionGroup in cc/api.h): the dense
# members of one call carry the same id and their count.
_group_keys = itertools.count(1)


def _grouped_body(tensors, op, prescale_factor, postscale_factor,
                  compression, device_dense, device_sparse, name,
                  membership):
    dense = sum(not isinstance(t, tf.IndexedSlices) for t in tensors)
    group = (next(_group_keys), dense) if dense > 1 else None
    results = []
    for i, t in enumerate(tensors):
        member_name = None if name is None else f"{name}.{i}"
        if isinstance(t, tf.IndexedSlices):
            # Averaged by the caller, outside an eager call's tf.function.
            results.append(_gather_slices(t, member_name, device_sparse,
                                          membership))
        else:
            results.append(_allreduce_dense(t, op, prescale_factor,
                                            postscale_factor, member_name,
                                            compression, device_dense,
                                            membership, group))
    return results


# Eager grouped collectives run their ops inside one tf.function so that they
# are all submitted to the core at once (and fused) instead of one after
# another. One function per configuration; TensorFlow caches traces per
# input shapes.
_grouped_functions = {}


def run_grouped(key, body, tensors):
    """body(tensors), as one tf.function (cached under `key`) when eager.

    `body` builds one collective per tensor and returns the list of results.
    `key` must tell apart everything the body depends on besides the
    tensors, including the process set (Membership.key).
    """
    if not tf.executing_eagerly():
        return body(tensors)
    try:
        fn = _grouped_functions.get(key)
    except TypeError:  # An unhashable custom compressor: no caching.
        fn = tf.function(body, reduce_retracing=True, autograph=False)
        return _accept_gradients_of_any_dtype(list(fn(tensors)))
    if fn is None:
        fn = _grouped_functions[key] = tf.function(
            body, reduce_retracing=True, autograph=False)
    return _accept_gradients_of_any_dtype(list(fn(tensors)))


def _accept_gradients_of_any_dtype(results):
    """`results` of an eager grouped tf.function, each passing on an
    incoming gradient cast to its own dtype.

    Why: TensorFlow differentiates the function with a traced backward
    function whose inputs have the outputs' dtypes, and fails on any other
    ("expected to be a double tensor but is a float tensor"), while a single
    op's registered gradient takes what comes, as Horovod's grouped ops do
    (its tests pass float32 gradients for float64 outputs). The gradient
    that comes back then has the input's dtype.
    """
    if not record.could_possibly_record():
        return results  # no tape is recording: nothing to differentiate
    return [_cast_incoming_gradient(r) for r in results]


@tf.custom_gradient
def _identity_casting_gradient(tensor):
    def grad(upstream):
        return tf.cast(upstream, tensor.dtype)
    return tf.identity(tensor), grad


def _cast_incoming_gradient(result):
    if isinstance(result, tf.IndexedSlices):
        return tf.IndexedSlices(_cast_incoming_gradient(result.values),
                                result.indices, result.dense_shape)
    if not (result.dtype.is_floating or result.dtype.is_complex):
        return result  # not differentiable
    return _identity_casting_gradient(result)


@_do_not_convert
def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """allreduce() of a list of tensors, submitted together.

    Same arguments as allreduce() (applied to every tensor; tensor i is
    named `<name>.<i>` when `name` is given). Eagerly, the reductions run
    inside one tf.function, so the core receives them in one burst and fuses
    them. Returns a list in the order of `tensors`.
    """
    del ignore_name_scope  # names never include the name scope
    api_name = "tfring.grouped_allreduce()"
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(
            f"{api_name} received a {type(tensors).__name__}. Expected a list "
            "or tuple of tensors. Pass a list, or use tfring.allreduce() for "
            "one tensor.")
    op, prescale_factor, postscale_factor = _check_reduce_args(
        op, average, prescale_factor, postscale_factor, api_name)
    membership = resolve_process_set(process_set, api_name)
    list_agreement.check_same_length_once(
        ("allreduce", name, membership.key), tensors, "tensors", "reduce",
        api_name, membership, name)
    if not tensors:
        return []
    tensors = [_prepare_reduce_input(t, op, prescale_factor, postscale_factor,
                                     api_name) for t in tensors]

    def body(group):
        return _grouped_body(group, op, prescale_factor, postscale_factor,
                             compression, device_dense, device_sparse, name,
                             membership)

    key = ("allreduce", op, prescale_factor, postscale_factor, compression,
           device_dense, device_sparse, name, membership.key)
    results = run_grouped(key, body, tensors)
    return [_average_gathered_slices(r, op, device_sparse, membership)
            if isinstance(r, tf.IndexedSlices) else r for r in results]


@_do_not_convert
def allgather(tensor, name=None, ignore_name_scope=False,
              process_set=global_process_set, device_dense='',
              device_sparse=''):
    """Concatenates every rank's `tensor` along the first dimension.

    The first dimension may differ across ranks; the others, the rank and the
    dtype must match. A scalar counts as one row. Returns the concatenation
    in rank order. With `process_set`, only that set's ranks take part (and
    may call this), in the order of their job ranks
    (process_set.rank() indexes this rank's rows). `ignore_name_scope` is
    accepted for Horovod compatibility (names never include the name
    scope).
    """
    del ignore_name_scope
    api_name = "tfring.allgather()"
    basics._check_initialized(api_name)
    membership = resolve_process_set(process_set, api_name)
    if isinstance(tensor, tf.IndexedSlices):
        raise TypeError(
            f"{api_name} received a tf.IndexedSlices. Expected a dense "
            "tensor. Gather its .values and .indices separately, or use "
            "tfring.allreduce(slices, op=tfring.Sum).")
    tensor = tf.convert_to_tensor(tensor)
    check_dtype(tensor, GATHER_BROADCAST_DTYPES, api_name, name)
    with tf.device(device_dense):
        return _ops.allgather_op(tensor, name=name,
                                 process_set_id=membership.id)


@_do_not_convert
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set, device_dense='',
              device_sparse=''):
    """Every rank gets root_rank's `tensor` (same shape and dtype on all).

    With `process_set`, only that set's ranks take part (and may call
    this), and root_rank must be one of them: a job rank, as tfring.rank()
    returns, not a position within the set. `ignore_name_scope` is accepted
    for Horovod compatibility (names never include the name scope).
    """
    del ignore_name_scope
    api_name = "tfring.broadcast()"
    basics._check_initialized(api_name)
    membership = resolve_process_set(process_set, api_name)
    root_rank = check_root_rank(root_rank, api_name, membership)
    tensor = tf.convert_to_tensor(tensor)
    check_dtype(tensor, GATHER_BROADCAST_DTYPES, api_name, name)
    with tf.device(device_dense):
        return _ops.broadcast_op(tensor, root_rank, name=name,
                                 process_set_id=membership.id)
