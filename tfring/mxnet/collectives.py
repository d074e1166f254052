# The collectives of tfring.mxnet, with horovod.mxnet's signatures: each
# checks its NDArrays, names them, hands their memory to the core and
# returns once the core has completed them (horovod.mxnet returns at once
# and lets MXNet's engine wait; here the wait is in the call, without the
# GIL, see ndarrays.py for why).
#
# Everything that can be wrong on one rank alone (dtype, context, process
# set, root rank) fails here, before C++, with ValueError/TypeError; what
# ranks disagree about fails with HorovodInternalError on every rank
# involved. `priority` is accepted for Horovod compatibility: the core
# orders collectives by negotiation, not priority.

import numbers

import numpy as np

from tfring import _core
from tfring import basics
from tfring import list_lengths as _lengths
from tfring import process_sets as _process_sets
from tfring import reduce_args as _reduce_args
from tfring.common import outcome as _outcome
from tfring.common.naming import CollectiveNames
from tfring.mxnet import ndarrays as _nd
from tfring.process_sets import global_process_set
from tfring.reduce_args import (  # noqa: F401  (horovod.mxnet's op names)
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
)

_CollectiveType = _core.CollectiveType
names = CollectiveNames()

# Members of a grouped call enqueued before a later member was refused:
# their group never completes (shutdown ends it), so their arrays are kept.
_refused_groups = []


def _membership(process_set, api_name):
    membership = _process_sets.resolve(process_set, api_name, allow_outside=True)
    if not membership.included:
        me = basics.rank()
        raise ValueError(
            f"{api_name} was called on rank {me} with process_set={process_set}, "
            f"which does not contain rank {me}. Only the ranks of a set take part "
            f"in its collectives (the others would wait forever for rank {me}). "
            "Call it only where process_set.included() is True, or pass a set "
            "with this rank.")
    return membership


def _check_list(arrays, api_name):
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(
            f"{api_name} received {type(arrays).__name__}. Expected a list of "
            "NDArrays. Pass e.g. [a1, a2].")
    return list(arrays)


def _grouped_names(kind, name, count, api_name, process_set):
    base = names.name(kind, name, api_name, process_set)
    key = (kind, name, getattr(process_set, "process_set_id", None))
    if basics.size() > 1 and _lengths.needs_check(key):
        membership = _membership(process_set, api_name)
        if membership.size > 1:
            lengths = _submit(_CollectiveType.allgather, [f"{base}.list_length"],
                              [_nd.from_numpy(np.array([count], dtype=np.int64))],
                              [_core.DataType.int64], None, process_set_id=membership.id)
            gathered = _nd.from_core_output(lengths[0], np.int64).asnumpy().tolist()
            _lengths.mark_checked(key)
            _lengths.raise_unless_equal(
                gathered, membership.ranks, "NDArrays", "pass", api_name,
                "Build the same model and trainer on every rank before reducing.")
    return [f"{base}_{i}" for i in range(count)]


def submit_async(collective_type, tensor_names, inputs, dtypes, outputs, **fields):
    """Every NDArray of one call to the core once MXNet has finished with
    them (a group when several: one negotiation round); the pending list.
    The caller keeps `inputs` and `outputs` alive until wait_all()."""
    for array in inputs:
        _nd.ready_to_read(array)
    for array in outputs or ():
        _nd.ready_to_write(array)
    group = {}
    if len(inputs) > 1:
        group = {"group_key": names.next_group_key(), "group_size": len(inputs)}
    pending = []
    for i, (name, array, dtype) in enumerate(zip(tensor_names, inputs, dtypes)):
        if outputs is not None:
            fields["output"] = _nd.address(outputs[i])
        try:
            pending.append(_outcome.enqueue(collective_type, name, dtype, array.shape,
                                            _nd.address(array), **group, **fields))
        except Exception:
            if pending:
                _refused_groups.append((pending, list(inputs), list(outputs or ())))
            raise
    return pending


def _submit(collective_type, tensor_names, inputs, dtypes, outputs, **fields):
    pending = submit_async(collective_type, tensor_names, inputs, dtypes, outputs, **fields)
    _outcome.wait_all(pending)
    return pending


# --- allreduce ------------------------------------------------------------


def _reduction_args(op, average, prescale_factor, postscale_factor, api_name):
    op = _reduce_args.resolve_op(op, average, api_name)
    basics._check_initialized(api_name)
    return (op,
            _reduce_args.check_scale_factor(prescale_factor, "prescale_factor", api_name),
            _reduce_args.check_scale_factor(postscale_factor, "postscale_factor", api_name))


def allreduce_fields(op, average, prescale_factor, postscale_factor, process_set, api_name):
    """The core fields of an allreduce after checking its arguments."""
    op, pre, post = _reduction_args(op, average, prescale_factor, postscale_factor, api_name)
    membership = _membership(process_set, api_name)
    return dict(reduce_op=_core.ReduceOp(op), prescale_factor=pre, postscale_factor=post,
                process_set_id=membership.id)


def _allreduce(arrays, in_place, tensor_names, op, average, prescale_factor,
               postscale_factor, process_set, api_name):
    fields = allreduce_fields(op, average, prescale_factor, postscale_factor,
                              process_set, api_name)
    dtypes = [_nd.check_array(a, api_name, reduction=True) for a in arrays]
    results = arrays if in_place else [_nd.new_output(a) for a in arrays]
    _submit(_CollectiveType.allreduce, tensor_names, arrays, dtypes, results, **fields)
    return results


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """The reduction of `tensor` over the ranks of `process_set`, in a new
    NDArray (the input is not modified). op: Average (default), Sum, Min,
    Max or Product; prescale_factor and postscale_factor multiply the values
    before and after the reduction."""
    del priority
    api_name = "allreduce"
    return _allreduce([tensor], False, [names.name("allreduce", name, api_name, process_set)],
                      op, average, prescale_factor, postscale_factor, process_set,
                      api_name)[0]


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce() writing the result into `tensor` itself; returns it."""
    del priority
    api_name = "allreduce_"
    return _allreduce([tensor], True, [names.name("allreduce", name, api_name, process_set)],
                      op, average, prescale_factor, postscale_factor, process_set,
                      api_name)[0]


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce() of a list of NDArrays negotiated and fused together; the
    list of results."""
    del priority
    api_name = "grouped_allreduce"
    tensors = _check_list(tensors, api_name)
    return _allreduce(tensors, False,
                      _grouped_names("grouped_allreduce", name, len(tensors), api_name,
                                     process_set),
                      op, average, prescale_factor, postscale_factor, process_set, api_name)


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """grouped_allreduce() writing each result into its input; the list."""
    del priority
    api_name = "grouped_allreduce_"
    tensors = _check_list(tensors, api_name)
    return _allreduce(tensors, True,
                      _grouped_names("grouped_allreduce", name, len(tensors), api_name,
                                     process_set),
                      op, average, prescale_factor, postscale_factor, process_set, api_name)


# --- allgather ------------------------------------------------------------


def _allgather(arrays, tensor_names, process_set, api_name):
    basics._check_initialized(api_name)
    membership = _membership(process_set, api_name)
    dtypes = [_nd.check_array(a, api_name) for a in arrays]
    pending = _submit(_CollectiveType.allgather, tensor_names, arrays, dtypes, None,
                      process_set_id=membership.id)
    return [_nd.from_core_output(p, a.dtype) for p, a in zip(pending, arrays)]


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """`tensor` from every rank of the set concatenated along dimension 0
    (ranks may differ in that dimension only)."""
    del priority
    api_name = "allgather"
    return _allgather([tensor], [names.name("allgather", name, api_name, process_set)],
                      process_set, api_name)[0]


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather() of a list of NDArrays, negotiated together; the list."""
    del priority
    api_name = "grouped_allgather"
    tensors = _check_list(tensors, api_name)
    return _allgather(tensors, _grouped_names("grouped_allgather", name, len(tensors),
                                              api_name, process_set),
                      process_set, api_name)


# --- broadcast ------------------------------------------------------------


def _broadcast(tensor, in_place, root_rank, name, process_set, api_name):
    basics._check_initialized(api_name)
    membership = _membership(process_set, api_name)
    root_rank = _reduce_args.check_root_rank(root_rank, api_name, membership)
    dtype = _nd.check_array(tensor, api_name)
    output = tensor if in_place else _nd.new_output(tensor)
    _submit(_CollectiveType.broadcast, [names.name("broadcast", name, api_name, process_set)],
            [tensor], [dtype], [output], root_rank=root_rank, process_set_id=membership.id)
    return output


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """root_rank's `tensor` on every rank of the set, in a new NDArray (the
    input is not modified)."""
    del priority
    return _broadcast(tensor, False, root_rank, name, process_set, "broadcast")


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's values; returns it."""
    del priority
    return _broadcast(tensor, True, root_rank, name, process_set, "broadcast_")


def broadcast_many_(arrays, root_rank, tensor_names, api_name):
    """Overwrites each NDArray of `arrays` with root_rank's, all submitted
    before any is waited for (so the core fuses them); names as given."""
    basics._check_initialized(api_name)
    root_rank = _reduce_args.check_root_rank(root_rank, api_name)
    dtypes = [_nd.check_array(a, api_name) for a in arrays]
    pending = []
    for name, array, dtype in zip(tensor_names, arrays, dtypes):
        pending += submit_async(_CollectiveType.broadcast, [name], [array], [dtype],
                                [array], root_rank=root_rank)
    _outcome.wait_all(pending)


# --- alltoall -------------------------------------------------------------


def _split_list(splits, api_name):
    if splits is None:
        return []
    if hasattr(splits, "asnumpy"):
        splits = splits.asnumpy()
    if isinstance(splits, np.ndarray):
        if splits.ndim != 1 or not np.issubdtype(splits.dtype, np.integer):
            raise ValueError(
                f"{api_name} received splits of dtype {splits.dtype} and shape "
                f"{list(splits.shape)}. Expected a 1-D integer array with one entry "
                "per rank of the set. Pass e.g. mx.nd.array([2, 1], dtype='int32').")
        return [int(s) for s in splits.tolist()]
    if isinstance(splits, (list, tuple)) and all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in splits):
        return [int(s) for s in splits]
    raise TypeError(
        f"{api_name} received splits={splits!r}. Expected None (split dimension 0 "
        "evenly), a list of ints or a 1-D integer NDArray with one entry per rank of "
        "the set. Pass one of those.")


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` (dimension 0) to rank i of the set and
    returns the rows received, concatenated; with `splits` given, also an
    int32 NDArray of the rows received from each rank (as horovod.mxnet)."""
    del priority
    api_name = "alltoall"
    basics._check_initialized(api_name)
    membership = _membership(process_set, api_name)
    split_list = _split_list(splits, api_name)
    dtype = _nd.check_array(tensor, api_name)
    pending = _submit(_CollectiveType.alltoall,
                      [names.name("alltoall", name, api_name, process_set)], [tensor],
                      [dtype], None, splits=split_list, process_set_id=membership.id)
    output = _nd.from_core_output(pending[0], tensor.dtype)
    if splits is None:
        return output
    received = np.array(list(pending[0].received_splits()), dtype=np.int32)
    return output, _nd.from_numpy(received)


# --- reducescatter --------------------------------------------------------


def _reducescatter(arrays, tensor_names, op, prescale_factor, postscale_factor,
                   process_set, api_name):
    fields = allreduce_fields(op, None, prescale_factor, postscale_factor, process_set,
                              api_name)
    if fields["reduce_op"] not in (_core.ReduceOp(Average), _core.ReduceOp(Sum)):
        raise ValueError(
            f"{api_name} received op={_reduce_args.reduce_op_name(int(fields['reduce_op']))}, "
            "which reducescatter does not implement. Expected Average or Sum. Pass "
            "op=hvd.Average or op=hvd.Sum.")
    dtypes = [_nd.check_array(a, api_name, reduction=True) for a in arrays]
    for array in arrays:
        if array.shape == ():
            # Refused here, as horovod.mxnet does, rather than by the core's
            # negotiation: the mistake is this rank's own.
            raise ValueError(
                f"{api_name} received a scalar NDArray, but reducescatter divides "
                "dimension 0 between the ranks. Expected an NDArray with at least one "
                "dimension. Reshape it first, e.g. array.reshape((1,)).")
    pending = _submit(_CollectiveType.reducescatter, tensor_names, arrays, dtypes, None,
                      **fields)
    return [_nd.from_core_output(p, a.dtype) for p, a in zip(pending, arrays)]


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The reduction of `tensor` over the set, of which this rank keeps its
    block of dimension 0 (earlier ranks get one more row when it does not
    divide)."""
    del priority
    api_name = "reducescatter"
    return _reducescatter([tensor], [names.name("reducescatter", name, api_name, process_set)],
                          op, prescale_factor, postscale_factor, process_set, api_name)[0]


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter() of a list of NDArrays, negotiated together; the list."""
    del priority
    api_name = "grouped_reducescatter"
    tensors = _check_list(tensors, api_name)
    return _reducescatter(tensors, _grouped_names("grouped_reducescatter", name, len(tensors),
                                                  api_name, process_set),
                          op, prescale_factor, postscale_factor, process_set, api_name)


# --- join -----------------------------------------------------------------


def join():
    """Blocks until every rank has joined (the joined ranks take part in the
    others' allreduces with zeros meanwhile); returns the last rank to join."""
    basics._check_initialized("join")
    last = _nd.from_numpy(np.array([-1], dtype=np.int32))
    _submit(_CollectiveType.join, [_core.JOIN_TENSOR_NAME], [last], [_core.DataType.int32],
            [last])
    return int(last.asnumpy()[0])
