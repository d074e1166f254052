# DistributedGradientTape: a tf.GradientTape whose gradient() returns the
# gradients averaged (or otherwise reduced) over all ranks, or over the
# ranks of a process set.
#
# Why composition: the wrapper holds the user's tape and forwards to it,
# instead of building a subclass of the tape's class at run time. The user's
# tape keeps recording; only gradient() adds the reduction, which submits all
# gradients of one call together (grouped_allreduce) so the core can fuse
# them. Everything else (watch, stop_recording, reset, jacobian, `with`) is
# the wrapped tape's own behaviour.
#
# Sources registered with register_local_source() (or the local_layers of
# PartialDistributedGradientTape) keep their gradients on their rank; see
# tfring/local_gradients.py.

import numbers
import warnings

import tensorflow as tf

from tfring import collectives
from tfring import local_gradients as _local
from tfring import process_sets as _process_sets
from tfring.compression import Compression
from tfring.process_sets import global_process_set


def _split_evenly(items, num_groups):
    """Splits `items` into `num_groups` contiguous, nearly equal parts."""
    quotient, remainder = divmod(len(items), num_groups)
    parts, start = [], 0
    for i in range(num_groups):
        end = start + quotient + (1 if i < remainder else 0)
        if end > start:
            parts.append(items[start:end])
        start = end
    return parts


def _check_groups(groups, num_groups, api_name):
    if num_groups != 0:
        warnings.warn("`num_groups` is deprecated; use `groups`.",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is None:
        return None
    if (isinstance(groups, numbers.Integral) and not isinstance(groups, bool)
            and groups > 0):
        return int(groups)
    if isinstance(groups, (list, tuple)) and all(
            isinstance(g, (list, tuple)) for g in groups):
        return [list(g) for g in groups]
    raise ValueError(
        f"{api_name} received groups={groups!r}. Expected a positive int or "
        "a list of lists of variables. Pass e.g. groups=2, or groups=None "
        "for a single group.")


def _reduce_parts(grads, parts, reduce_args):
    """One grouped_allreduce per part; returns the reduced `grads`."""
    out = list(grads)
    for part in parts:
        reduced = collectives.grouped_allreduce([grads[p] for p in part],
                                                **reduce_args)
        for p, g in zip(part, reduced):
            out[p] = g
    return out


# Eagerly, all reductions of one gradient() call run inside one tf.function,
# so they reach the core together. Scripts usually wrap a new tape every
# step, so the functions are shared by all tapes with the same arguments
# (a new function per tape would be traced again on every step), and the
# same process set (`membership_key`: what the traced body depends on).
_eager_reduce_functions = {}


def _eager_reduce_function(reduce_args, membership_key):
    def reduce(grads, parts):
        return _reduce_parts(grads, parts, reduce_args)

    try:
        key = (tuple(sorted(reduce_args.items())), membership_key)
        fn = _eager_reduce_functions.get(key)
    except TypeError:  # An unhashable custom compressor: no sharing.
        return tf.function(reduce, reduce_retracing=True, autograph=False)
    if fn is None:
        fn = _eager_reduce_functions[key] = tf.function(
            reduce, reduce_retracing=True, autograph=False)
    return fn


def reduce_gradients(grads, sources, membership, reduce_args, groups,
                     sparse_as_dense, local_sources=None, scale_local=True):
    """Reduces the flat list `grads` (one per flat source) over the ranks of
    `membership`; returns the new list.

    None stays None (every rank must then have None there too). Gradients
    of `local_sources` are not reduced: they stay this rank's own, divided
    by the set's size when `scale_local` (Horovod's rule), and are not made
    dense by `sparse_as_dense` (Horovod only densifies what it reduces).
    On a rank outside the set (`membership.included` False) nothing is
    reduced: every gradient stays this rank's own, as in Horovod, with the
    same densifying and scaling. Shared by DistributedGradientTape and the
    Keras DistributedOptimizer, so both submit gradients to the core the
    same way.
    """
    local = (local_sources.positions(sources) if local_sources
             else frozenset())
    out = list(grads)
    present = [i for i, g in enumerate(out)
               if g is not None and i not in local]
    if sparse_as_dense:
        for i in present:
            if isinstance(out[i], tf.IndexedSlices):
                out[i] = tf.convert_to_tensor(out[i])
    compression = reduce_args.get("compression")
    if present and membership.included and getattr(
            compression, "reduces_gradient_lists", False):
        # PowerSGD (tfring/powersgd.py): the whole list at once, its state
        # keyed by each gradient's position among the sources.
        reduced = compression.reduce_gradient_list(
            [out[i] for i in present], [f"g{i}" for i in present], reduce_args)
        for i, g in zip(present, reduced):
            out[i] = g
    elif present and membership.included:
        parts = partition_positions(groups, present, sources)
        present_grads = [out[i] for i in present]
        if tf.executing_eagerly():
            reduced = _eager_reduce_function(
                reduce_args, membership.key)(present_grads, parts)
        else:
            reduced = _reduce_parts(present_grads, parts, reduce_args)
        for i, g in zip(present, reduced):
            out[i] = g
    if scale_local:
        for i in sorted(local):
            if out[i] is not None:
                out[i] = _local.scale(out[i], membership.size)
    return out


class DistributedGradientTape:
    """Wraps a tf.GradientTape so that gradient() reduces over all ranks.

    Usage (as with horovod.tensorflow):

        with tf.GradientTape() as tape:
            loss = ...
        tape = tfring.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    or `with tfring.DistributedGradientTape(tf.GradientTape()) as tape:`.

    Args:
      gradtape: the tf.GradientTape to wrap.
      device_dense: as for tfring.allreduce().
      device_sparse: as for tfring.allreduce().
      compression: as for tfring.allreduce().
      sparse_as_dense: convert IndexedSlices gradients to dense tensors
        before reducing (better for embedding gradients that touch most
        rows).
      op: Average (default), Sum, Min, Max or Product.
      gradient_predivide_factor: with op=Average, divide gradients by this
        factor before the sum and by size()/factor after it (the same
        average; other rounding and overflow behaviour).
      num_groups: deprecated; use groups.
      groups: None (all gradients in one call), an int (split them into that
        many calls) or a list of lists of variables (one call per list;
        variables in no list are reduced alone).
      process_set: the tfring.ProcessSet whose ranks reduce the gradients
        together (default: every rank); Average then divides by its size.
        On a rank outside the set, gradient() returns that rank's own
        gradients, unreduced (as in Horovod), so every rank may run the
        same code.
      scale_local_gradients: divide the gradients of sources registered
        with register_local_source() by the process set's size (Horovod's
        default, True), whatever `op` is; False leaves them as computed.

    Any attribute other than gradient(), register_local_source(),
    get_local_and_global_gradients() and `with` is the wrapped tape's.
    """

    def __init__(self, gradtape, device_dense='', device_sparse='',
                 compression=Compression.none, sparse_as_dense=False,
                 op=collectives.Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, process_set=global_process_set,
                 scale_local_gradients=True):
        api_name = "tfring.DistributedGradientTape()"
        if isinstance(gradtape, DistributedGradientTape):
            raise TypeError(
                f"{api_name} received a tape that is already a "
                "DistributedGradientTape. Expected a tf.GradientTape. Wrap "
                "the original tape once.")
        op, factor = check_op_and_predivide_factor(
            op, gradient_predivide_factor, api_name)
        check_process_set_type(process_set, api_name)
        self._scale_local = _local.check_scale_flag(scale_local_gradients,
                                                    api_name)
        self._local_sources = _local.LocalSources()
        self._tape = gradtape
        self._groups = _check_groups(groups, num_groups, api_name)
        self._sparse_as_dense = sparse_as_dense
        self._reduce_args = dict(
            device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, op=op, process_set=process_set)
        if op == int(collectives.Average):
            # Horovod's split of the average: divide by f before the sum and
            # multiply by f after it; the core's Average adds the 1/size.
            self._reduce_args.update(prescale_factor=1.0 / factor,
                                     postscale_factor=factor)

    @property
    def process_set(self):
        return self._reduce_args["process_set"]

    @property
    def scale_local_gradients(self):
        return self._scale_local

    def register_local_source(self, source):
        """Keeps the gradient of `source` (a variable or a watched tensor)
        on this rank: gradient() does not reduce it and, with
        scale_local_gradients=True, divides it by the process set's size.
        Every rank must register the same positions of `sources` (the
        others are reduced together, in order)."""
        self._local_sources.add_source(
            source, "tfring.DistributedGradientTape.register_local_source()")

    def _register_local_layers(self, layers):
        self._local_sources.add_layers(layers)

    @property
    def _eager_reduce(self):
        """The tf.function that reduces eagerly for this tape's settings and
        process set (shared with every tape that has the same)."""
        membership = _process_sets.resolve(
            self.process_set, "tfring.DistributedGradientTape.gradient()",
            allow_outside=True)
        return _eager_reduce_function(self._reduce_args, membership.key)

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The wrapped tape's gradients, reduced over all ranks (those of
        registered local sources stay local, see register_local_source()).

        A gradient that is None (source not connected to target) stays None;
        every rank must then have None for that source too.
        """
        # Checked on every call (the set may have been removed meanwhile),
        # before the local gradients are computed.
        membership = _process_sets.resolve(
            self.process_set, "tfring.DistributedGradientTape.gradient()",
            allow_outside=True)
        grads = self._tape.gradient(
            target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients)
        out = reduce_gradients(
            tf.nest.flatten(grads), tf.nest.flatten(sources), membership,
            self._reduce_args, self._groups, self._sparse_as_dense,
            self._local_sources, self._scale_local)
        return tf.nest.pack_sequence_as(grads, out)

    @tf.autograph.experimental.do_not_convert
    def get_local_and_global_gradients(
            self, target, sources, output_gradients=None,
            unconnected_gradients=tf.UnconnectedGradients.NONE):
        """gradient(), split as Horovod does: returns two lists of
        (source, gradient) pairs, first the registered local sources', then
        the others' (reduced), each in the order of (flattened) `sources`.
        """
        grads = self.gradient(target, sources, output_gradients,
                              unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        local = self._local_sources.positions(flat_sources)
        local_pairs, global_pairs = [], []
        for i, (s, g) in enumerate(zip(flat_sources,
                                       tf.nest.flatten(grads))):
            (local_pairs if i in local else global_pairs).append((s, g))
        return local_pairs, global_pairs

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        return self._tape.__exit__(exc_type, exc_value, traceback)

    def __getattr__(self, name):
        # Called only for names the wrapper itself lacks. The guard keeps a
        # half-built object (no _tape yet) from recursing forever.
        if name == "_tape":
            raise AttributeError(name)
        return getattr(self._tape, name)


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none,
                                   sparse_as_dense=False,
                                   op=collectives.Average,
                                   gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None,
                                   process_set=global_process_set,
                                   local_layers=None,
                                   scale_local_gradients=True):
    """A DistributedGradientTape whose `local_layers` keep their gradients
    local (Horovod's model-parallel helper).

    local_layers: None, a keras Layer or a list of them; their trainable
    variables are registered with register_local_source() (looked up when
    gradient() runs, so layers built later count too). The other arguments
    are DistributedGradientTape's.
    """
    layers = _local.check_local_layers(
        local_layers, "tfring.PartialDistributedGradientTape()")
    tape = DistributedGradientTape(
        gradtape, device_dense, device_sparse, compression, sparse_as_dense,
        op, gradient_predivide_factor, num_groups, groups, process_set,
        scale_local_gradients)
    tape._register_local_layers(layers)
    return tape


def partition_positions(groups, present, variables):
    """Splits positions 0..len(present)-1 into one tuple per reduce call.

    `groups` is None (one call), an int (that many calls of about equal
    size) or a list of lists of variables (one call per group; variables in
    no group go alone). `present[p]` indexes `variables` for position p.
    Returns a tuple of tuples, so it can key a tf.function trace.
    """
    positions = list(range(len(present)))
    if groups is None:
        parts = [positions]
    elif isinstance(groups, int):
        parts = _split_evenly(positions, groups)
    else:
        group_of = {}
        for g, group in enumerate(groups):
            for v in group:
                group_of[id(v)] = g
        parts = [[] for _ in groups]
        alone = []
        for p, i in enumerate(present):
            g = group_of.get(id(variables[i]))
            if g is None:
                alone.append([p])
            else:
                parts[g].append(p)
        parts = [p for p in parts if p] + alone
    return tuple(tuple(p) for p in parts if p)


def check_process_set_type(process_set, api_name):
    """A gradient reducer's process_set must be a tfring.ProcessSet; whether
    it is registered and holds this rank is checked when gradients are
    reduced (the set may be added or removed in between)."""
    if not isinstance(process_set, _process_sets.ProcessSet):
        raise TypeError(
            f"{api_name} received process_set={process_set!r} of type "
            f"{type(process_set).__name__}. Expected a tfring.ProcessSet "
            "(default: tfring.global_process_set). Pass one registered with "
            "tfring.init(process_sets=[...]) or tfring.add_process_set().")


def check_op_and_predivide_factor(op, gradient_predivide_factor, api_name):
    """Validates a gradient reducer's op and predivide factor; returns the
    op's value and the factor as a float."""
    op = collectives.reduce_op_value(op, api_name)
    factor = collectives.check_scale_factor(
        gradient_predivide_factor, "gradient_predivide_factor", api_name)
    if factor != 1.0 and op != int(collectives.Average):
        raise ValueError(
            f"{api_name} received gradient_predivide_factor={factor} "
            f"with op=tfring.{collectives.reduce_op_name(op)}. Expected "
            "op=tfring.Average: the factor splits the averaging. Drop "
            "the factor or use op=tfring.Average.")
    if factor == 0.0:
        raise ValueError(
            f"{api_name} received gradient_predivide_factor=0. Expected "
            "a non-zero factor (gradients are divided by it). Use 1.0 "
            "for no predivision.")
    return op, factor
