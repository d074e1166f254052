# The synchronous, out-of-place collectives of tfring.torch, differentiable.
#
# Why autograd functions: a collective inside a model (a gathered batch, a
# broadcast parameter, a reduced loss) must pass gradients back, and
# horovod.torch defines what they are; scripts that train through these
# calls get the same gradients here:
#   allreduce      the gradient allreduced with the same op and factors
#   allgather      the gradient averaged over the set, this rank's rows
#   broadcast      the gradient averaged over the set on the root, zero
#                  elsewhere
#   alltoall       the gradient sent back with the received splits
#   reducescatter  the gradient (times the set's size for Sum, and times
#                  the scale factors) allgathered
# Each forward runs the asynchronous form (collectives.py) and waits.

import torch

from tfring import basics
from tfring import process_sets as _process_sets
from tfring.process_sets import global_process_set
from tfring.torch import collectives as _c
from tfring.torch.compression import Compression
from tfring.torch.handles import synchronize


def _set_rank_and_size(process_set):
    """This rank's position in the set and the set's size."""
    membership = _process_sets.resolve(process_set, "autograd backward",
                                       allow_outside=True)
    return list(membership.ranks).index(basics.rank()), membership.size


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor,
                postscale_factor, process_set, compression):
        ctx.args = (average, op, prescale_factor, postscale_factor,
                    process_set)
        return synchronize(_c.allreduce_async(
            tensor, average, name, op, prescale_factor, postscale_factor,
            process_set, compression=compression))

    @staticmethod
    def backward(ctx, grad_output):
        average, op, pre, post, process_set = ctx.args
        grad = allreduce(grad_output.contiguous(), average=average, op=op,
                         prescale_factor=pre, postscale_factor=post,
                         process_set=process_set)
        return grad, None, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none,
              op=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """Reduces `tensor` over the ranks of `process_set` (Average by default)
    and returns the result; the input is not modified. Differentiable.

    compression: Compression.fp16 sends floating-point tensors as float16;
    Compression.bf16_wire / fp16_wire have the core encode float32
    Sum/Average data only where it crosses hosts.
    """
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, average, name, op,
                               prescale_factor, postscale_factor, process_set,
                               compression)
    return compression.decompress(reduced, ctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor,
                process_set, compression, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor,
                    process_set)
        return tuple(synchronize(_c.grouped_allreduce_async(
            list(tensors), average, name, op, prescale_factor,
            postscale_factor, process_set, compression=compression)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        average, op, pre, post, process_set = ctx.args
        grads = grouped_allreduce([g.contiguous() for g in grad_outputs],
                                  average=average, op=op,
                                  prescale_factor=pre, postscale_factor=post,
                                  process_set=process_set)
        return (None,) * 7 + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None,
                      compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """allreduce() of a list of tensors, negotiated and fused together;
    returns the list of results. Differentiable."""
    tensors = _c._check_tensor_list(tensors, "grouped_allreduce")
    compressed = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(
        average, name, op, prescale_factor, postscale_factor, process_set,
        compression, *[c for c, _ in compressed])
    return [compression.decompress(r, ctx)
            for r, (_, ctx) in zip(reduced, compressed)]


def _own_rows(grads, first_dims, process_set):
    """Backward of (grouped) allgather: each gradient averaged over the set,
    then the rows this rank contributed."""
    reduced = grouped_allreduce([g.contiguous() for g in grads],
                                op=_c.Average, process_set=process_set)
    counts = grouped_allgather(
        [torch.tensor([d], dtype=torch.int64) for d in first_dims],
        process_set=process_set)
    position, _ = _set_rank_and_size(process_set)
    return [r.narrow(0, int(c[:position].sum()), d)
            for r, c, d in zip(reduced, counts, first_dims)]


def _first_dim(tensor):
    return tensor.shape[0] if tensor.dim() > 0 else 1


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.first_dim = _first_dim(tensor)
        ctx.shape = tensor.shape
        ctx.process_set = process_set
        return synchronize(_c.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = _own_rows([grad_output], [ctx.first_dim], ctx.process_set)
        return grad.reshape(ctx.shape), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates `tensor` from every rank of the set along dimension 0
    (ranks may differ in that dimension only). Differentiable."""
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.first_dims = [_first_dim(t) for t in tensors]
        ctx.shapes = [t.shape for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(_c.grouped_allgather_async(
            list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = _own_rows(grad_outputs, ctx.first_dims, ctx.process_set)
        return (None, None) + tuple(
            g.reshape(s) for g, s in zip(grads, ctx.shapes))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather() of a list of tensors, negotiated together; returns the
    list of results. Differentiable."""
    tensors = _c._check_tensor_list(tensors, "grouped_allgather")
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(_c.broadcast_async(tensor, root_rank, name,
                                              process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=_c.Average,
                         process_set=ctx.process_set)
        if basics.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank of the set (the input is not
    modified). Differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(_c.alltoall_async(
            tensor, splits, name, process_set))
        ctx.received = received
        ctx.process_set = process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *_received_splits):
        grad, _ = synchronize(_c.alltoall_async(
            grad_output.contiguous(), ctx.received,
            process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` to rank i of the set (evenly split
    when None) and returns the received rows; with `splits`, as in Horovod,
    returns (output, received_splits), the latter the rows received from
    each rank. Differentiable."""
    return _Alltoall.apply(tensor, splits, name, process_set)


def _reducescatter_grads(grads, op, prescale_factor, postscale_factor,
                         process_set):
    _, set_size = _set_rank_and_size(process_set)
    scale = prescale_factor * postscale_factor
    if op == _c.Sum:
        scale *= set_size
    grads = [g.contiguous() * scale if scale != 1.0 else g.contiguous()
             for g in grads]
    return grouped_allgather(grads, process_set=process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor,
                postscale_factor):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(_c.reducescatter_async(
            tensor, name, op, process_set, prescale_factor,
            postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = _reducescatter_grads([grad_output], *ctx.args)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none,
                  op=_c.Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set (Average or Sum) and returns this rank's
    block of dimension 0. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, process_set,
                                   prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor,
                postscale_factor, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(_c.grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor,
            postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = _reducescatter_grads(grad_outputs, *ctx.args)
        return (None,) * 5 + tuple(grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none,
                          op=_c.Average, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter() of a list of tensors, negotiated together; returns the
    list of results. Differentiable."""
    tensors = _c._check_tensor_list(tensors, "grouped_reducescatter")
    compressed = [compression.compress(t) for t in tensors]
    reduced = _GroupedReducescatter.apply(
        name, op, process_set, prescale_factor, postscale_factor,
        *[c for c, _ in compressed])
    return [compression.decompress(r, ctx)
            for r, (_, ctx) in zip(reduced, compressed)]
