# The two gradient transformations DistributedOptimizer performs before the
# optimizer it wraps sees a gradient: the reduction over ranks
# (GradientReducer) and the local accumulation over several backward passes
# (LocalGradientAggregator).
#
# Why a separate module: both are independent of Keras' optimizer machinery
# (they only need tensors, variables and tf.cond), so the optimizer class can
# stay about wrapping, and each piece can be read on its own. The reduction
# reuses the tape's helpers, so DistributedGradientTape and
# DistributedOptimizer submit gradients to the core in exactly the same way:
# one grouped call per step (eagerly inside one tf.function) so they fuse.
# Gradients of registered local variables skip the reduction (see
# tfring/local_gradients.py).

import tensorflow as tf

from tfring import collectives
from tfring import local_gradients as _local
from tfring import process_sets as _process_sets
from tfring import tape as _tape
from tfring.process_sets import global_process_set


class GradientReducer:
    """Reduces a list of gradients (None entries stay None) over all ranks
    of a process set (by default the job).

    Holds the validated reduction settings of one DistributedOptimizer, and
    its local variables (`local_sources`), whose gradients are not reduced
    but divided by the set's size when `scale_local_gradients`.
    """

    def __init__(self, api_name, compression, sparse_as_dense, op,
                 gradient_predivide_factor, groups, num_groups=0,
                 device_dense='', device_sparse='',
                 process_set=global_process_set, scale_local_gradients=True,
                 local_sources=None):
        op, factor = _tape.check_op_and_predivide_factor(
            op, gradient_predivide_factor, api_name)
        _tape.check_process_set_type(process_set, api_name)
        self.scale_local_gradients = _local.check_scale_flag(
            scale_local_gradients, api_name)
        self.local_sources = (_local.LocalSources() if local_sources is None
                              else local_sources.copy())
        # Set by the first reduce() (which a tf.function runs once, when it
        # is traced): later registrations may then not be seen.
        self.used = False
        if not (hasattr(compression, "compress") and
                hasattr(compression, "decompress")):
            raise TypeError(
                f"{api_name} received compression={compression!r}. Expected "
                "a compressor with compress() and decompress(), such as "
                "tfring.Compression.none or tfring.Compression.fp16. Pass "
                "one of those.")
        self.op = op
        self.gradient_predivide_factor = factor
        self.sparse_as_dense = bool(sparse_as_dense)
        self.compression = compression
        self.groups = _tape._check_groups(groups, num_groups, api_name)
        self.process_set = process_set
        self.reduce_args = dict(device_dense=device_dense,
                                device_sparse=device_sparse,
                                compression=compression, op=op,
                                process_set=process_set)
        if op == int(collectives.Average):
            # Divide by f before the sum and multiply by f after it; the
            # core's Average adds the 1/size of the set (Horovod's split).
            self.reduce_args.update(prescale_factor=1.0 / factor,
                                    postscale_factor=factor)

    def reduce(self, grads, variables):
        """The reduced `grads`, in order; None where a gradient is None.
        Gradients of local variables stay this rank's own (scaled), and so
        do all gradients on a rank outside the process set (as in Horovod).

        Every rank must pass None at the same positions.
        """
        # Checked on every step: the set may have been removed meanwhile.
        membership = _process_sets.resolve(
            self.process_set, "tfring.keras.DistributedOptimizer.apply()",
            allow_outside=True)
        self.used = True
        return _tape.reduce_gradients(
            list(grads), list(variables), membership, self.reduce_args,
            self.groups, self.sparse_as_dense, self.local_sources,
            self.scale_local_gradients)

    def local_positions(self, variables):
        """Positions in `variables` whose gradients stay local."""
        return self.local_sources.positions(list(variables))


class LocalGradientAggregator:
    """Sums gradients locally for `passes` calls, then hands them on.

    The accumulators and the pass counter are variables owned by the
    optimizer (so they are saved, restored and never shared across ranks);
    this class only adds the update logic. In a tf.function the choice
    between "accumulate only" and "accumulate and apply" is a tf.cond on the
    counter, so one traced step serves every pass.
    """

    def __init__(self, passes, average, counter, accumulators):
        self.passes = passes
        self.average = average
        self.counter = counter
        self.accumulators = accumulators

    def __call__(self, optimizer, grads, variables, apply_fn):
        """Adds `grads` into the accumulators of `variables`; on every
        `passes`-th call runs apply_fn(summed_or_averaged_grads) and clears
        them. Positions whose gradient is None in this call stay None.
        """
        accumulators = [self.accumulators[optimizer._get_variable_index(v)]
                        for v in variables]
        for g, acc in zip(grads, accumulators):
            if g is not None:
                # IndexedSlices are scatter-added; the sum is dense.
                optimizer.assign_add(acc, g)
        self.counter.assign_add(1)
        present = [g is not None for g in grads]

        def apply_accumulated():
            summed = []
            for keep, acc in zip(present, accumulators):
                if not keep:
                    summed.append(None)
                    continue
                value = tf.identity(acc.value)
                if self.average:
                    value = value / tf.cast(self.passes, value.dtype)
                summed.append(value)
            apply_fn(summed)
            for keep, acc in zip(present, accumulators):
                if keep:
                    acc.assign(tf.zeros_like(acc.value))
            self.counter.assign(0)

        tf.cond(tf.greater_equal(self.counter, self.passes),
                apply_accumulated, lambda: None)
