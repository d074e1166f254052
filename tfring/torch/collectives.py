# The asynchronous and in-place collectives of tfring.torch, with
# horovod.torch's signatures: each checks its tensors, names them, hands
# their memory to the core and returns a Handle (tfring.torch.handles).
#
# Why this shape: nothing here is compiled against torch. A tensor reaches
# the core as the address of its contiguous CPU memory (tensor.data_ptr()),
# through the same pybind11 module and the same core as the TensorFlow ops;
# outputs of unknown size come back as buffers the core allocated, viewed as
# tensors without a copy. Everything that can be wrong on one rank alone
# (dtype, device, layout, process set, root rank) fails here, before C++;
# what ranks disagree about fails in synchronize() on every rank involved.
#
# Names: as in Horovod (tfring.common.naming, shared with tfring.mxnet).

import numbers

import torch

from tfring import _core
from tfring import basics
from tfring import reduce_args as _reduce_args
from tfring import errors as _errors
from tfring import list_lengths as _lengths
from tfring import process_sets as _process_sets
from tfring.common import outcome as _outcome
from tfring.common.naming import CollectiveNames
from tfring.process_sets import global_process_set
from tfring.compressors import NoneCompressor, wire_compression
from tfring.reduce_args import (  # noqa: F401  (horovod.torch's op names)
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
)
from tfring.torch import dtypes as _dtypes
from tfring.torch import handles as _handles
from tfring.torch import in_flight as _in_flight

_CollectiveType = _core.CollectiveType

_names = CollectiveNames()
_tensor_name = _names.name


def reset_names():
    """Restarts the numbering of unnamed collectives (at init(), as Horovod
    does, so every rank counts from the same point)."""
    _names.reset()


def _grouped_names(kind, name, count, api_name, process_set,
                   check_length=True):
    base = _tensor_name(kind, name, api_name, process_set)
    if check_length:
        key = (kind, name, getattr(process_set, "process_set_id", None))
        _check_group_length(count, key, base, api_name, process_set)
    return [f"{base}_{i}" for i in range(count)]


def _check_group_length(count, key, base, api_name, process_set):
    """On the first call of each kind and name: ranks whose lists differ in
    length raise ValueError on every rank (the tensors are matched by
    position, so the extra ones would wait forever)."""
    if basics.size() < 2 or not _lengths.needs_check(key):
        return
    membership = _membership(process_set, api_name)
    if membership.size < 2:
        return
    lengths = _handles.synchronize(allgather_async(
        torch.tensor([count], dtype=torch.int64), name=f"{base}.list_length",
        process_set=process_set))
    _lengths.mark_checked(key)
    _lengths.raise_unless_equal(
        lengths.tolist(), membership.ranks, "tensors", "pass", api_name,
        "Build the same model and optimizer on every rank before reducing.")


def check_tensor(tensor, api_name, reduction=False, any_dense_layout=False):
    """The core DataType of `tensor` after checking that the core can use its
    memory as it is: a dense CPU tensor of a supported dtype, contiguous
    (with `any_dense_layout`, for element-wise collectives: any layout that
    fills one block of memory, such as channels_last)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{api_name} received {type(tensor).__name__} {tensor!r:.80}. "
            "Expected a torch.Tensor. Pass a tensor (e.g. torch.tensor(x)).")
    if tensor.device.type == "meta":
        raise ValueError(
            f"{api_name} received a tensor on the 'meta' device, which has "
            "a shape but no data to send. Expected a CPU tensor with values. "
            "Materialize it first (e.g. module.to_empty(device='cpu') and "
            "initialize it, or torch.empty(shape)).")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"{api_name} received a tensor on device '{tensor.device}'. "
            "tfring.torch runs collectives on CPU tensors only; "
            f"{tensor.device.type} tensors are not supported yet. Move the "
            "tensor to the CPU first (tensor.cpu()) and the result back "
            "(result.to(device)).")
    if tensor.layout != torch.strided:
        raise ValueError(
            f"{api_name} received a tensor with layout {tensor.layout}. "
            "Expected a dense (torch.strided) tensor. Pass "
            "tensor.to_dense(), or use sparse_as_dense=True in "
            "DistributedOptimizer.")
    if not tensor.is_contiguous() and not (
            any_dense_layout and memory_order_shape(tensor) is not None):
        expected = ("elements that fill one block of memory, in any "
                    "dimension order (contiguous or channels_last)"
                    if any_dense_layout else "a contiguous tensor")
        raise ValueError(
            f"{api_name} received a tensor of shape {list(tensor.shape)} "
            f"with strides {list(tensor.stride())}, a view whose elements "
            "are not one contiguous block. The core reads and writes a "
            f"tensor's memory as one block: expected {expected}. Pass "
            "tensor.contiguous() (for an in-place form, copy the result "
            "back with tensor.copy_(result)).")
    return _dtypes.core_dtype(tensor, api_name, reduction)


def memory_order_shape(tensor):
    """The sizes of `tensor`'s dimensions in the order they lie in memory
    (outermost first), when its elements fill one block without gaps or
    overlaps (contiguous, channels_last, any permutation); else None.

    An element-wise collective may treat such a tensor as that contiguous
    shape: the ranks agree on it only if they lay the tensor out alike,
    so a layout that differs between ranks is a shape mismatch, not a
    silently wrong result (unless the permuted sizes happen to coincide)."""
    if tensor.is_contiguous() or tensor.numel() == 0:
        return list(tensor.shape)
    dims = sorted(((tensor.stride(d), tensor.size(d)) for d in
                   range(tensor.dim()) if tensor.size(d) != 1),
                  reverse=True)
    expected = 1
    for stride, size in reversed(dims):
        if stride != expected:
            return None
        expected *= size
    return [size for _, size in dims]


def _membership(process_set, api_name):
    membership = _process_sets.resolve(process_set, api_name,
                                       allow_outside=True)
    if not membership.included:
        me = basics.rank()
        raise ValueError(
            f"{api_name} was called on rank {me} with process_set="
            f"{process_set}, which does not contain rank {me}. Only the ranks "
            "of a set take part in its collectives (the others would wait "
            f"forever for rank {me}). Call it only where "
            "process_set.included() is True, or pass a set with this rank.")
    return membership


def _check_tensor_list(tensors, api_name):
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors,
                                                           (list, tuple)):
        raise TypeError(
            f"{api_name} received {type(tensors).__name__}. Expected a list "
            "of tensors. Pass e.g. [t1, t2].")
    return list(tensors)


def _enqueue(collective_type, name, tensor, dtype, **fields):
    """One tensor to the core; the PendingCollective."""
    return _outcome.enqueue(collective_type, name, dtype,
                            memory_order_shape(tensor), tensor.data_ptr(),
                            **fields)


def _submit(collective_type, names, inputs, dtypes, outputs, finish,
            **fields):
    """Every tensor of one call to the core, as one group when several (the
    core negotiates a group in one round); the Handle."""
    _in_flight.prune_orphans()
    group = {}
    if len(inputs) > 1:
        group = {"group_key": _names.next_group_key(),
                 "group_size": len(inputs)}
    pending, written = [], []
    for i, (name, tensor, dtype) in enumerate(zip(names, inputs, dtypes)):
        output = outputs[i] if outputs is not None else None
        if output is not None:
            fields["output"] = output.data_ptr()
            written.append((output, fields["output"]))
        try:
            pending.append(_enqueue(collective_type, name, tensor, dtype,
                                    **group, **fields))
        except Exception:
            # The members already enqueued keep their memory until the
            # core ends them (their group never completes: shutdown does).
            _in_flight.orphan(_in_flight.Flight(
                pending, names[:i], list(inputs[:i]) + [o for o, _ in written]))
            raise
    flight = _in_flight.Flight(
        pending, names, list(inputs) + [o for o, _ in written])
    return _handles.Handle(flight, finish, written)


# --- allreduce ------------------------------------------------------------


def _reduction_args(op, average, prescale_factor, postscale_factor, api_name):
    op = _reduce_args.resolve_op(op, average, api_name)
    basics._check_initialized(api_name)
    return (op,
            _reduce_args.check_scale_factor(prescale_factor,
                                               "prescale_factor", api_name),
            _reduce_args.check_scale_factor(postscale_factor,
                                               "postscale_factor", api_name))


def _allreduce_async(tensors, in_place, names, op, average, prescale_factor,
                     postscale_factor, process_set, api_name, single,
                     compression=NoneCompressor):
    op, pre, post = _reduction_args(op, average, prescale_factor,
                                    postscale_factor, api_name)
    membership = _membership(process_set, api_name)
    dtypes = [check_tensor(t, api_name, reduction=True, any_dense_layout=True)
              for t in tensors]
    # New outputs only once every argument has been checked.
    results = tensors if in_place else [_handles.new_output(t) for t in tensors]

    def finish(_):
        return results[0] if single else list(results)

    return _submit(_CollectiveType.allreduce, names, tensors, dtypes,
                   results, finish, reduce_op=_core.ReduceOp(op),
                   prescale_factor=pre, postscale_factor=post,
                   process_set_id=membership.id,
                   compression=wire_compression(compression))


def allreduce_async(tensor, average=None, name=None, op=None,
                    prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set,
                    compression=NoneCompressor):
    """Starts reducing `tensor` over the ranks of `process_set` into a new
    tensor (the input is not modified); returns a handle for synchronize().

    op: Average (default), Sum, Min, Max or Product; prescale_factor and
    postscale_factor multiply the values before and after the reduction.
    compression: Compression.bf16_wire or .fp16_wire have the core encode
    float32 Sum/Average data where it crosses hosts (other compressors are
    casts the caller applies: see allreduce()).
    """
    api_name = "allreduce_async"
    return _allreduce_async([tensor], False,
                            [_tensor_name("allreduce", name, api_name, process_set)], op,
                            average, prescale_factor, postscale_factor,
                            process_set, api_name, single=True,
                            compression=compression)


def allreduce_async_(tensor, average=None, name=None, op=None,
                     prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set,
                     compression=NoneCompressor):
    """allreduce_async() writing the result into `tensor` itself."""
    api_name = "allreduce_async_"
    return _allreduce_async([tensor], True,
                            [_tensor_name("allreduce", name, api_name, process_set)], op,
                            average, prescale_factor, postscale_factor,
                            process_set, api_name, single=True,
                            compression=compression)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` in place over the ranks; returns it."""
    return _handles.synchronize(allreduce_async_(
        tensor, average, name, op, prescale_factor, postscale_factor,
        process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None,
                            prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set,
                            compression=NoneCompressor):
    """allreduce_async() of a list of tensors negotiated and fused together;
    synchronize() returns the list of results."""
    api_name = "grouped_allreduce_async"
    tensors = _check_tensor_list(tensors, api_name)
    return _allreduce_async(
        tensors, False,
        _grouped_names("grouped_allreduce", name, len(tensors), api_name, process_set), op,
        average, prescale_factor, postscale_factor, process_set, api_name,
        single=False, compression=compression)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set,
                             compression=NoneCompressor):
    """grouped_allreduce_async() writing each result into its input."""
    api_name = "grouped_allreduce_async_"
    tensors = _check_tensor_list(tensors, api_name)
    return _allreduce_async(
        tensors, True,
        _grouped_names("grouped_allreduce", name, len(tensors), api_name, process_set), op,
        average, prescale_factor, postscale_factor, process_set, api_name,
        single=False, compression=compression)


def grouped_allreduce_(tensors, average=None, name=None, op=None,
                       prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """Reduces each tensor of the list in place; returns the list."""
    return _handles.synchronize(grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor,
        process_set))


# --- allgather ------------------------------------------------------------


def _gathered(dtypes_in_torch, single):
    def finish(pending):
        outputs = [_handles.output_tensor(p, d)
                   for p, d in zip(pending, dtypes_in_torch)]
        return outputs[0] if single else outputs
    return finish


def _allgather_async(tensors, names, process_set, api_name, single):
    basics._check_initialized(api_name)
    membership = _membership(process_set, api_name)
    dtypes = [check_tensor(t, api_name) for t in tensors]
    return _submit(_CollectiveType.allgather, names, tensors, dtypes, None,
                   _gathered([t.dtype for t in tensors], single),
                   process_set_id=membership.id)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating `tensor` from every rank of the set along
    dimension 0 (ranks may differ in that dimension only)."""
    api_name = "allgather_async"
    return _allgather_async([tensor],
                            [_tensor_name("allgather", name, api_name, process_set)],
                            process_set, api_name, single=True)


def grouped_allgather_async(tensors, name=None,
                            process_set=global_process_set):
    """allgather_async() of a list of tensors, negotiated together."""
    api_name = "grouped_allgather_async"
    tensors = _check_tensor_list(tensors, api_name)
    return _allgather_async(
        tensors, _grouped_names("grouped_allgather", name, len(tensors),
                                api_name, process_set),
        process_set, api_name, single=False)


def sparse_allreduce_async(tensor, name=None, op=Average,
                           process_set=global_process_set):
    """Starts reducing a sparse COO `tensor` as Horovod does: every rank's
    indices and values are allgathered and summed by coalescing (Average
    then divides by the set's size). Returns a function that waits and
    returns the reduced sparse tensor (coalesced)."""
    api_name = "sparse_allreduce_async"
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError(
            f"{api_name} received a {type(tensor).__name__} with layout "
            f"{getattr(tensor, 'layout', None)}. Expected a sparse COO "
            "tensor (layout torch.sparse_coo). Pass tensor.to_sparse(), or "
            "allreduce_async() for a dense tensor.")
    op = _reduce_args.resolve_op(op, None, api_name)
    if op not in (Average, Sum):
        raise ValueError(
            f"{api_name} received op={_reduce_args.reduce_op_name(op)}, which "
            "a sparse allreduce does not implement. Expected Average or Sum. "
            "Pass op=hvd.Average or op=hvd.Sum.")
    base = name if name is not None else _tensor_name(
        "sparse_allreduce", None, api_name, process_set)
    tensor = tensor.coalesce()
    shape = tensor.shape
    values = allgather_async(tensor._values().contiguous(),
                             name=f"{base}.values", process_set=process_set)
    indices = allgather_async(tensor._indices().t().contiguous(),
                              name=f"{base}.indices", process_set=process_set)

    def result():
        total = torch.sparse_coo_tensor(
            _handles.synchronize(indices).t(), _handles.synchronize(values),
            shape, check_invariants=True).coalesce()
        if op == Average:
            total = total / _process_sets.resolve(
                process_set, api_name, allow_outside=True).size
        return total

    return result


# --- broadcast ------------------------------------------------------------


def _broadcast_async(tensor, in_place, root_rank, name, process_set, api_name):
    basics._check_initialized(api_name)
    membership = _membership(process_set, api_name)
    root_rank = _reduce_args.check_root_rank(root_rank, api_name,
                                                membership)
    dtype = check_tensor(tensor, api_name, any_dense_layout=True)
    output = tensor if in_place else _handles.new_output(tensor)
    return _submit(_CollectiveType.broadcast,
                   [_tensor_name("broadcast", name, api_name, process_set)], [tensor],
                   [dtype], [output], lambda _: output,
                   root_rank=root_rank, process_set_id=membership.id)


def broadcast_async(tensor, root_rank, name=None,
                    process_set=global_process_set):
    """Starts copying `root_rank`'s `tensor` to every rank of the set into a
    new tensor (the input is not modified)."""
    return _broadcast_async(tensor, False, root_rank, name, process_set,
                            "broadcast_async")


def broadcast_async_(tensor, root_rank, name=None,
                     process_set=global_process_set):
    """broadcast_async() writing root_rank's values into `tensor` itself."""
    return _broadcast_async(tensor, True, root_rank, name, process_set,
                            "broadcast_async_")


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's values; returns it."""
    return _handles.synchronize(broadcast_async_(tensor, root_rank, name,
                                                 process_set))


# --- alltoall -------------------------------------------------------------


def _split_list(splits, api_name):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.dtype.is_floating_point or \
                splits.dtype == torch.bool:
            raise ValueError(
                f"{api_name} received splits of dtype {splits.dtype} and shape "
                f"{list(splits.shape)}. Expected a 1-D integer tensor with one "
                "entry per rank of the set. Pass e.g. torch.tensor([2, 1], "
                "dtype=torch.int32).")
        return [int(s) for s in splits.tolist()]
    if isinstance(splits, (list, tuple)) and all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool)
            for s in splits):
        return [int(s) for s in splits]
    raise TypeError(
        f"{api_name} received splits={splits!r}. Expected None (split "
        "dimension 0 evenly), a list of ints or a 1-D integer tensor with one "
        "entry per rank of the set. Pass one of those.")


def alltoall_async(tensor, splits=None, name=None,
                   process_set=global_process_set):
    """Starts sending splits[i] rows of `tensor` (dimension 0) to rank i of
    the set and receiving theirs; synchronize() returns (output,
    received_splits), the latter an int32 tensor of the rows from each rank.
    """
    api_name = "alltoall_async"
    basics._check_initialized(api_name)
    membership = _membership(process_set, api_name)
    split_list = _split_list(splits, api_name)
    dtype = check_tensor(tensor, api_name)
    torch_dtype = tensor.dtype

    def finish(pending):
        received = torch.tensor(list(pending[0].received_splits()),
                                dtype=torch.int32)
        return _handles.output_tensor(pending[0], torch_dtype), received

    return _submit(_CollectiveType.alltoall,
                   [_tensor_name("alltoall", name, api_name, process_set)], [tensor],
                   [dtype], None, finish, splits=split_list,
                   process_set_id=membership.id)


# --- reducescatter --------------------------------------------------------


def _reducescatter_async(tensors, names, op, prescale_factor,
                         postscale_factor, process_set, api_name, single):
    op, pre, post = _reduction_args(op, None, prescale_factor,
                                    postscale_factor, api_name)
    if op not in (Average, Sum):
        raise ValueError(
            f"{api_name} received op={_reduce_args.reduce_op_name(op)}, "
            "which reducescatter does not implement. Expected Average or "
            "Sum. Pass op=hvd.Average or op=hvd.Sum.")
    membership = _membership(process_set, api_name)
    dtypes = [check_tensor(t, api_name, reduction=True) for t in tensors]
    return _submit(_CollectiveType.reducescatter, names, tensors, dtypes,
                   None, _gathered([t.dtype for t in tensors], single),
                   reduce_op=_core.ReduceOp(op), prescale_factor=pre,
                   postscale_factor=post, process_set_id=membership.id)


def reducescatter_async(tensor, name=None, op=Average,
                        process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts reducing `tensor` over the set and keeping this rank's block of
    dimension 0 (earlier ranks get one more row when it does not divide)."""
    api_name = "reducescatter_async"
    return _reducescatter_async(
        [tensor], [_tensor_name("reducescatter", name, api_name, process_set)], op,
        prescale_factor, postscale_factor, process_set, api_name, single=True)


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter_async() of a list of tensors, negotiated together."""
    api_name = "grouped_reducescatter_async"
    tensors = _check_tensor_list(tensors, api_name)
    return _reducescatter_async(
        tensors, _grouped_names("grouped_reducescatter", name, len(tensors),
                                api_name, process_set),
        op, prescale_factor, postscale_factor, process_set, api_name,
        single=False)


def unsupported(api_name, what):
    """The error for a Horovod feature tfring does not have."""
    return _errors.UnsupportedOperationError(f"{api_name}: {what}")
