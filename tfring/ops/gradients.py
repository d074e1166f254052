"""Gradients of tfring's collective ops, registered with TensorFlow.

Why here and not in the public API: a gradient belongs to the op type, so
tf.GradientTape and tf.gradients find it whichever wrapper created the op.

Each gradient is itself a collective, so every rank must compute it under
the same name. Its name is derived from the forward op's, eagerly and in
graphs (`<name>_grad`, `<name>_grad_extremum`, ...; see gradient_base_name
and the naming rule in `tfring.ops.collective_ops`), so it does not depend
on the order in which TensorFlow builds the gradients, which follows the
order the forward ops were built in.

Let rank r hold x_r and y = reduce(x_0, ..., x_{n-1}) be the result every rank
receives, and g_s the incoming gradient of y on rank s. Then
dL/dx_r = sum_s g_s * dy/dx_r, which gives:

* Sum / Average: allreduce of g with the same op and scale factors.
* Min / Max: sum_s g_s, given to the ranks whose x_r is the extremum (split
  evenly between tied ranks), times prescale * postscale.
* Product: sum_s g_s * postscale * prescale * prod_{q != r} (prescale * x_q).
* Allgather: row block r of the average of the gathered gradient.
* Broadcast (Horovod's definition): the average of the g_s on the root
  rank, zero elsewhere.
* Alltoall: the reverse alltoall: every rank sends each gradient row back to
  the rank the forward row came from.
* Reducescatter (Horovod's definition): the allgather of g, times
  prescale * postscale, and times size() for Sum.

In a process set everything above happens within the set: "every rank" is
every rank of the set, size() its size and r this rank's position in it.
Each gradient runs in the forward op's set (its `process_set_id`
attribute), and only that set's ranks compute it.
"""

import tensorflow as tf

from tfring import _core
from tfring.ops.collective_ops import allgather_op
from tfring.ops.collective_ops import allreduce_op
from tfring.ops.collective_ops import alltoall_op
from tfring.ops.collective_ops import gradient_base_name
from tfring.ops.collective_ops import process_set_rank_op
from tfring.ops.collective_ops import rank_op
from tfring.ops.collective_ops import size_op

_AVERAGE = int(_core.ReduceOp.Average)
_SUM = int(_core.ReduceOp.Sum)
_MIN = int(_core.ReduceOp.Min)
_MAX = int(_core.ReduceOp.Max)
_PRODUCT = int(_core.ReduceOp.Product)


def _gradient_name(op, suffix):
    """`<forward name>_<suffix>` (see gradient_base_name), or None for an
    unnamed eager forward op."""
    base = gradient_base_name(op)
    return f"{base}_{suffix}" if base else None


def _scale(dtype, factor):
    return tf.constant(factor, dtype=dtype)


def _set_rank(process_set_id):
    """This rank's position in the set, evaluated when the gradient runs."""
    return rank_op() if process_set_id == 0 else process_set_rank_op(
        process_set_id)


@tf.RegisterGradient("Tfring>Allreduce")
def _allreduce_grad(op, grad):
    reduce_op = op.get_attr("reduce_op")
    prescale = op.get_attr("prescale_factor")
    postscale = op.get_attr("postscale_factor")
    ps = op.get_attr("process_set_id")
    if reduce_op in (_SUM, _AVERAGE):
        return allreduce_op(grad, reduce_op, prescale, postscale,
                            name=_gradient_name(op, "grad"),
                            process_set_id=ps)

    x = op.inputs[0]
    summed = allreduce_op(grad, _SUM, name=_gradient_name(op, "grad"),
                          process_set_id=ps)
    chain = _scale(grad.dtype, prescale * postscale)
    if reduce_op in (_MIN, _MAX):
        # Which ranks hold the extremum: compare x with the extremum of the
        # unscaled inputs (exact, unlike comparing with the scaled output). A
        # negative prescale turns the minimum of prescale * x into the
        # maximum of x.
        extremum_op = reduce_op
        if prescale < 0:
            extremum_op = _MAX if reduce_op == _MIN else _MIN
        extremum = allreduce_op(x, extremum_op,
                                name=_gradient_name(op, "grad_extremum"),
                                process_set_id=ps)
        holds = tf.cast(tf.equal(x, extremum), grad.dtype)
        holders = allreduce_op(holds, _SUM,
                               name=_gradient_name(op, "grad_holders"),
                               process_set_id=ps)
        return summed * holds / holders * chain
    if reduce_op == _PRODUCT:
        gathered = allgather_op(tf.expand_dims(x, 0),
                                name=_gradient_name(op, "grad_inputs"),
                                process_set_id=ps)
        rank = _set_rank(ps)
        others = tf.concat([gathered[:rank], gathered[rank + 1:]], axis=0)
        product_of_others = tf.reduce_prod(
            others * _scale(x.dtype, prescale), axis=0)
        return summed * tf.cast(product_of_others, grad.dtype) * chain
    raise ValueError(
        f"tfring cannot differentiate an allreduce with reduce_op "
        f"{reduce_op}; gradients exist for Average, Sum, Min, Max and "
        "Product.")


@tf.RegisterGradient("Tfring>Allgather")
def _allgather_grad(op, grad):
    x = op.inputs[0]
    ps = op.get_attr("process_set_id")
    averaged = allreduce_op(grad, _AVERAGE, name=_gradient_name(op, "grad"),
                            process_set_id=ps)
    rank = _set_rank(ps)
    if x.shape.rank == 0:
        # Scalars were gathered one per rank.
        return tf.gather(averaged, rank)
    # This rank's rows start after the rows of all lower ranks.
    rows = allgather_op(tf.shape(x, out_type=tf.int64)[:1],
                        name=_gradient_name(op, "grad_rows"),
                        process_set_id=ps)
    begin = tf.reduce_sum(rows[:rank])
    return tf.reshape(averaged[begin:begin + rows[rank]], tf.shape(x))


@tf.RegisterGradient("Tfring>Broadcast")
def _broadcast_grad(op, grad):
    # Horovod's definition: the root receives the average of every rank's
    # incoming gradient, the other ranks zero (their input did not affect
    # the output). root_rank is a job rank, also in a process set.
    root_rank = op.get_attr("root_rank")
    averaged = allreduce_op(grad, _AVERAGE, name=_gradient_name(op, "grad"),
                            process_set_id=op.get_attr("process_set_id"))
    return tf.where(tf.equal(rank_op(), root_rank), averaged,
                    tf.zeros_like(averaged))


@tf.RegisterGradient("Tfring>Alltoall")
def _alltoall_grad(op, grad, unused_received_splits_grad):
    # The forward op received received_splits[j] rows from rank j; sending
    # that many gradient rows back to each rank returns every row's gradient
    # to where the row came from, in the order it was sent.
    received_splits = op.outputs[1]
    grad_input, _ = alltoall_op(grad, received_splits,
                                name=_gradient_name(op, "grad"),
                                process_set_id=op.get_attr("process_set_id"))
    return [grad_input, None]


@tf.RegisterGradient("Tfring>Reducescatter")
def _reducescatter_grad(op, grad):
    # Horovod's definition (its tests pin it): for Sum the gathered gradient
    # is multiplied by the number of ranks; Average takes it as it is.
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    ps = op.get_attr("process_set_id")
    if op.get_attr("reduce_op") == _SUM:
        grad = grad * tf.cast(size_op(ps), grad.dtype)
    if scale != 1.0:
        grad = grad * _scale(grad.dtype, scale)
    return allgather_op(grad, name=_gradient_name(op, "grad"),
                        process_set_id=ps)
