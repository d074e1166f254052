# DistributedOptimizer: a Keras 3 optimizer that reduces every step's
# gradients over all ranks, then lets the optimizer it wraps apply them.
#
# Why composition: Keras 3's model.compile() accepts only
# keras.optimizers.Optimizer instances, so the wrapper is one (a static
# class), and it holds the user's optimizer as `inner_optimizer` (Keras' own
# name for this, which its TensorBoard and SwapEMAWeights callbacks already
# unwrap) instead of building a subclass of the user's class at run time.
# State lives in the inner optimizer: learning rate, iterations, slots. The
# gradients reach the inner apply() already averaged, so its clipping,
# weight decay, EMA and gradient_accumulation_steps behave as they do in
# single-process training with the global batch.
#
# Why a second class for mixed precision: keras' LossScaleOptimizer (LSO)
# tests the gradients it receives for inf/NaN and skips the step when it
# finds any. Outside a DistributedOptimizer those are one rank's local
# gradients, so one rank could skip the step (and the allreduce inside it)
# while the others wait for it. DistributedLossScaleOptimizer puts the LSO
# inside: gradients are reduced first, so every rank tests the same values
# and takes the same branch. It is also an LSO instance, so model.compile()
# does not wrap it a second time.
#
# Local variables (register_local_var, PartialDistributedOptimizer): their
# gradients skip the reduction (tfring/local_gradients.py), so they differ
# per rank; in DistributedLossScaleOptimizer the ranks then first agree on
# whether any of them overflowed, so they still skip steps together.

import copy
import warnings

import keras
import numpy as np
import tensorflow as tf

from tfring import collectives
from tfring import local_gradients as _local
from tfring.compression import Compression
from tfring.powersgd import PowerSGD
from tfring.process_sets import global_process_set
from tfring.keras.gradient_aggregation import (GradientReducer,
                                               LocalGradientAggregator)

_Optimizer = keras.optimizers.Optimizer
_LossScaleOptimizer = keras.optimizers.LossScaleOptimizer

_COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16,
                 "bf16_wire": Compression.bf16_wire,
                 "fp16_wire": Compression.fp16_wire}


def _compression_config(compression):
    """What get_config() holds for `compression`: a name, PowerSGD's
    arguments, or None (a custom compressor is not serialized)."""
    for name, value in _COMPRESSIONS.items():
        if compression is value:
            return name
    if isinstance(compression, PowerSGD):
        return {"class_name": "PowerSGD", "config": compression.get_config()}
    return None


def _compression_from_config(config):
    if isinstance(config, dict) and config.get("class_name") == "PowerSGD":
        return PowerSGD(**config["config"])
    return _COMPRESSIONS.get(config or "none", Compression.none)


def _wants_loss_scaling(optimizer):
    """Whether DistributedOptimizer(optimizer) must scale the loss: the user
    gave an LSO, or model.compile() would add one (global mixed_float16)."""
    if (not isinstance(optimizer, _Optimizer)
            or isinstance(optimizer, DistributedOptimizer)):
        return False
    return (isinstance(optimizer, _LossScaleOptimizer)
            or keras.config.dtype_policy().name == "mixed_float16")


def _check_optimizer(optimizer, api_name):
    if isinstance(optimizer, DistributedOptimizer):
        raise TypeError(
            f"{api_name} received an optimizer that is already a "
            f"tfring DistributedOptimizer ('{optimizer.name}'). Expected the "
            "plain Keras optimizer. Wrap the original optimizer once.")
    if not isinstance(optimizer, _Optimizer):
        raise TypeError(
            f"{api_name} received {optimizer!r} of type "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}. "
            "Expected a Keras 3 optimizer instance (keras.optimizers."
            "Optimizer, e.g. keras.optimizers.SGD(0.01)); tf_keras / legacy "
            "optimizers are not supported. Pass e.g. "
            "tfring.DistributedOptimizer(keras.optimizers.Adam(1e-3)).")


def _check_passes(value, api_name):
    if (isinstance(value, bool) or not isinstance(value, int)
            or value < 1):
        raise ValueError(
            f"{api_name} received backward_passes_per_step={value!r}. "
            "Expected an int >= 1 (how many gradients to sum locally before "
            "each allreduce). Pass e.g. backward_passes_per_step=1.")
    return value


@keras.saving.register_keras_serializable(package="tfring")
class DistributedOptimizer(_Optimizer):
    """A Keras optimizer that averages gradients across ranks, then applies
    them with the optimizer it wraps.

    Usage (as with horovod.tensorflow.keras):

        opt = keras.optimizers.SGD(0.01 * tfring.size(), momentum=0.9)
        model.compile(optimizer=tfring.DistributedOptimizer(opt), loss="mse")

    It works with compile/fit/evaluate and in custom loops that call
    `apply_gradients(zip(grads, vars))` or `apply(grads, vars)`, eagerly or
    inside tf.function. Each call submits all gradients together (they fuse
    in the core); a gradient that is None stays None, and must then be None
    on every rank. tf.IndexedSlices gradients (Embedding) are allgathered
    unless `sparse_as_dense=True`.

    The wrapped optimizer is `inner_optimizer`; it owns the learning rate,
    `iterations` and the slot variables (read and set them through the
    wrapper or directly). Unknown public attributes (`momentum`, `beta_1`,
    ...) are read from and written to it. Because it receives the reduced
    gradients, its `clipnorm`, `clipvalue`, `global_clipnorm`, weight decay
    and `gradient_accumulation_steps` act on averaged gradients, exactly as
    in one process with the global batch (with gradient_accumulation_steps
    every micro-batch is still reduced; `backward_passes_per_step` saves
    that communication).

    Mixed precision: `DistributedOptimizer(opt)` returns a
    `DistributedLossScaleOptimizer` (a subclass of this class and of
    keras.optimizers.LossScaleOptimizer) when `opt` is a LossScaleOptimizer
    or when the global dtype policy is "mixed_float16" at construction (then
    it wraps `opt` in a LossScaleOptimizer, as model.compile() would). It
    reduces the scaled gradients first and lets the LossScaleOptimizer test
    the reduced ones for inf/NaN, so all ranks skip a step together (and
    halve the loss scale together) when any rank's gradients overflow.
    model.compile() does not wrap it again. If a keras LossScaleOptimizer
    would wrap a DistributedOptimizer instead (e.g. compile() of a model
    whose own dtype policy is mixed_float16 while the global policy was
    float32 when the DistributedOptimizer was made), that LossScaleOptimizer
    would decide per rank, so it is refused with a ValueError naming the
    fix: `tfring.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
    opt))`.

    Saving: the class is registered as "tfring>DistributedOptimizer", so
    `model.save("m.keras")` stores it with its settings and the inner
    optimizer's config and state. `tfring.keras.load_model(path)` loads
    such a file (or one saved with a plain optimizer) and returns the model
    with a DistributedOptimizer. Plain `keras.models.load_model(path)` also
    loads it, once `import tfring` or `import tfring.keras` has run in the
    process (importing registers the classes); in a process that must not
    import tfring, no class can stand in for it. A custom compressor and
    `groups` given as lists of variables are not saved (they come back as
    Compression.none and None).

    Args:
      optimizer: the keras.optimizers.Optimizer to wrap.
      name: the wrapper's name (default "distributed_" + optimizer.name).
      compression: tfring.Compression.none, .fp16 (a cast to float16),
        .bf16_wire / .fp16_wire (encoded only where it crosses hosts), or a
        tfring.PowerSGD (saved with the model: its arguments in the config,
        its state with the optimizer's variables).
      sparse_as_dense: reduce tf.IndexedSlices gradients as dense tensors.
      backward_passes_per_step: sum gradients locally over this many calls
        and reduce and apply them on every such call (others only add to
        the local sums); the inner optimizer counts applied steps only. In
        between, IndexedSlices are summed into dense accumulators.
      average_aggregated_gradients: divide those local sums by
        backward_passes_per_step (then n ranks x k passes x batch b equal
        one process with batch n*k*b).
      op: tfring.Average (default), Sum, Min, Max or Product.
      gradient_predivide_factor: with op=Average, divide by this factor
        before the sum and by size()/factor after it.
      groups: None (one reduce call per step), an int (split the gradients
        into that many calls) or a list of lists of variables (one call per
        list; variables in no list are reduced alone).
      device_dense: device for the dense reductions.
      device_sparse: device for the IndexedSlices reductions.
      num_groups: deprecated; use groups.
      process_set: the tfring.ProcessSet whose ranks average their gradients
        together (default: every rank); Average divides by its size. A rank
        outside the set applies its own gradients, unreduced (as in
        Horovod), so every rank may run the same code. Not saved with the
        model (process sets exist only while a job runs): a loaded
        optimizer reduces over every rank.
      scale_local_gradients: divide the gradients of variables registered
        with register_local_var() by the process set's size (True, Horovod's
        default, whatever `op` is), or leave them as computed (False).

    Local variables: `register_local_var(var)` keeps `var`'s gradient on
    this rank (not reduced), for model-parallel weights that differ per
    rank; register them before the first step (a traced step keeps the
    set it was traced with), and on every rank at the same positions of
    the variable list. The inner optimizer's `global_clipnorm` then sees
    per-rank gradients, so it may clip the reduced ones differently per
    rank. Registrations are not saved with the model.
    """

    def __new__(cls, optimizer=None, *args, **kwargs):
        if cls is DistributedOptimizer and _wants_loss_scaling(optimizer):
            cls = DistributedLossScaleOptimizer
        return super().__new__(cls)

    # Horovod's positional order (horovod.tensorflow.keras), so positional
    # calls written for Horovod bind to the same parameters.
    def __init__(self, optimizer, name=None, device_dense='', device_sparse='',
                 compression=Compression.none, sparse_as_dense=False,
                 gradient_predivide_factor=1.0, op=collectives.Average,
                 backward_passes_per_step=1,
                 average_aggregated_gradients=False, num_groups=0,
                 groups=None, process_set=global_process_set,
                 scale_local_gradients=True):
        api_name = f"tfring.keras.{type(self).__name__}()"
        _check_optimizer(optimizer, api_name)
        passes = _check_passes(backward_passes_per_step, api_name)
        reducer = GradientReducer(
            api_name, compression, sparse_as_dense, op,
            gradient_predivide_factor, groups, num_groups, device_dense,
            device_sparse, process_set, scale_local_gradients)
        # Not super().__init__(): in DistributedLossScaleOptimizer the next
        # class in line is LossScaleOptimizer, whose state this wrapper keeps
        # in the wrapped LossScaleOptimizer instead.
        _Optimizer.__init__(self, learning_rate=0.0,
                            name=name or f"distributed_{optimizer.name}")
        # The base class made an iteration counter and a learning rate of
        # its own; the wrapper uses the inner optimizer's.
        self._untrack_variable(self._iterations)
        self._untrack_variable(self._learning_rate)
        self.inner_optimizer = optimizer
        self._reducer = reducer
        self._passes = passes
        self._average_aggregated = bool(average_aggregated_gradients)
        self._aggregator = None
        self._tfring_ready = True

    # --- the settings, read-only (they shape the traced step) -------------

    @property
    def compression(self):
        return self._reducer.compression

    @property
    def sparse_as_dense(self):
        return self._reducer.sparse_as_dense

    @property
    def backward_passes_per_step(self):
        return self._passes

    @property
    def average_aggregated_gradients(self):
        return self._average_aggregated

    @property
    def op(self):
        return self._reducer.op

    @property
    def gradient_predivide_factor(self):
        return self._reducer.gradient_predivide_factor

    @property
    def groups(self):
        return self._reducer.groups

    @property
    def process_set(self):
        return self._reducer.process_set

    @property
    def scale_local_gradients(self):
        return self._reducer.scale_local_gradients

    def register_local_var(self, var):
        """Keeps the gradient of `var` on this rank: it is not reduced and,
        with scale_local_gradients=True, is divided by the process set's
        size (Horovod's rule). Call it before the first step."""
        api_name = f"{type(self).__name__}.register_local_var()"
        self._reducer.local_sources.add_source(var, api_name, "variable")
        if self._reducer.used:
            warnings.warn(
                f"{api_name} was called after the optimizer reduced "
                "gradients: a train step traced before (model.fit's, or a "
                "tf.function of yours) still reduces this variable's "
                "gradient. Register local variables before the first step, "
                "or retrace the step (e.g. compile the model again).",
                stacklevel=2)

    def _set_compression(self, compression):
        """For load_model(): a new compressor before the first step."""
        r = self._reducer
        self._reducer = GradientReducer(
            "tfring.keras.load_model()", compression, r.sparse_as_dense,
            r.op, r.gradient_predivide_factor, r.groups,
            device_dense=r.reduce_args["device_dense"],
            device_sparse=r.reduce_args["device_sparse"],
            process_set=r.process_set,
            scale_local_gradients=r.scale_local_gradients,
            local_sources=r.local_sources)

    # --- state delegated to the inner optimizer ---------------------------

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def variables(self):
        # The inner optimizer's, then the wrapper's own (gradient
        # accumulators and their counter with backward_passes_per_step > 1).
        return self.inner_optimizer.variables + self._variables[:]

    @property
    def loss_scale_factor(self):
        inner = self.__dict__.get("inner_optimizer")
        return None if inner is None else inner.loss_scale_factor

    @loss_scale_factor.setter
    def loss_scale_factor(self, value):
        if not self.__dict__.get("_tfring_ready"):
            return  # The base constructor's default; the inner one counts.
        if value is None:
            # keras.optimizers.LossScaleOptimizer.__init__ does exactly this
            # to the optimizer it wraps.
            raise ValueError(
                f"A keras LossScaleOptimizer is wrapping the tfring "
                f"DistributedOptimizer '{self.name}' (model.compile() does "
                "this when the model's dtype policy is 'mixed_float16'). "
                "That LossScaleOptimizer would test each rank's own "
                "gradients for inf/NaN, so one rank could skip the step "
                "while the others wait for its gradients (a hang). Expected "
                "the loss scaling inside the DistributedOptimizer. Wrap the "
                "LossScaleOptimizer instead: tfring.DistributedOptimizer("
                "keras.optimizers.LossScaleOptimizer(opt)), or create the "
                "DistributedOptimizer after keras.mixed_precision."
                "set_global_policy('mixed_float16'), which does that. (To "
                "change a static loss_scale_factor, set it on "
                "inner_optimizer.)")
        self.inner_optimizer.loss_scale_factor = value

    def __getattr__(self, name):
        # Only called for names the wrapper lacks: the inner optimizer's
        # public hyperparameters (momentum, beta_1, ...).
        if name.startswith("_") or name == "inner_optimizer":
            raise AttributeError(name)
        inner = self.__dict__.get("inner_optimizer")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __setattr__(self, name, value):
        # Public attributes the wrapper lacks but the inner optimizer has
        # (e.g. `momentum`, which momentum-correcting callbacks set) go to
        # the inner optimizer, which is the one that uses them.
        if name == "loss_scale_factor":
            # Straight to the property: Keras' __setattr__ would skip the
            # assignment when the value is already the current one.
            DistributedOptimizer.loss_scale_factor.fset(self, value)
            return
        inner = self.__dict__.get("inner_optimizer")
        if (self.__dict__.get("_tfring_ready") and not name.startswith("_")
                and name not in self.__dict__
                and not hasattr(type(self), name) and hasattr(inner, name)):
            setattr(inner, name, value)
            return
        super().__setattr__(name, value)

    # --- building and applying --------------------------------------------

    def build(self, var_list):
        var_list = list(var_list)
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        # Not super(): see __init__.
        _Optimizer.build(self, var_list)
        if self._passes > 1:
            counter = self.add_variable(shape=(), dtype="int",
                                        name="backward_pass_counter")
            accumulators = [
                self.add_variable_from_reference(
                    v, name="accumulated_gradient") for v in var_list]
            self._aggregator = LocalGradientAggregator(
                self._passes, self._average_aggregated, counter,
                accumulators)
        self.built = True

    def apply(self, grads, trainable_variables=None):
        """Reduces `grads` over all ranks and applies them with the inner
        optimizer (with backward_passes_per_step > 1: on every k-th call,
        the local sums of the last k calls)."""
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    f"{type(self).__name__}.apply() received gradients "
                    "without variables before it was built. Expected "
                    "`trainable_variables` on the first call. Pass them, "
                    "or call optimizer.build(model.trainable_variables) "
                    "first.")
            trainable_variables = self._trainable_variables
        else:
            trainable_variables = list(trainable_variables)
            if not self.built:
                self.build(trainable_variables)
            self._check_variables_are_known(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise ValueError(
                f"{type(self).__name__}.apply() received {len(grads)} "
                f"gradients for {len(trainable_variables)} variables. "
                "Expected one gradient (or None) per variable. Pass "
                "matching lists.")

        def reduce_and_apply(local_grads):
            reduced = self._reducer.reduce(local_grads, trainable_variables)
            reduced = self._agree_on_local_overflow(reduced,
                                                    trainable_variables)
            self.inner_optimizer.apply(reduced, trainable_variables)

        if self._aggregator is None:
            reduce_and_apply(grads)
        else:
            self._aggregator(self, grads, trainable_variables,
                             reduce_and_apply)

    def _agree_on_local_overflow(self, grads, variables):
        """Only DistributedLossScaleOptimizer tests gradients for inf/NaN."""
        return grads

    def apply_gradients(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        if grads_and_vars:
            grads, trainable_variables = zip(*grads_and_vars)
            self.apply(list(grads), list(trainable_variables))
        return self.iterations

    def stateless_apply(self, optimizer_variables, grads,
                        trainable_variables):
        raise ValueError(
            f"{type(self).__name__}.stateless_apply() was called. It is not "
            "supported with the TensorFlow backend (like any Keras "
            "optimizer there). Use apply() or apply_gradients().")

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(
            var_list=var_list, var_names=var_names)

    def set_weights(self, weights):
        variables = self.variables
        if not self.built or len(weights) != len(variables):
            raise ValueError(
                f"{type(self).__name__}.set_weights() received "
                f"{len(weights)} arrays for {len(variables)} optimizer "
                "variables. Expected one array per variable of a built "
                "optimizer (see optimizer.variables). Build it first with "
                "optimizer.build(model.trainable_variables).")
        for variable, weight in zip(variables, weights):
            variable.assign(weight)

    # --- serialization ----------------------------------------------------

    def get_config(self):
        groups = self._reducer.groups
        return {
            "name": self.name,
            "optimizer": keras.optimizers.serialize(self.inner_optimizer),
            "compression": _compression_config(self._reducer.compression),
            "sparse_as_dense": self._reducer.sparse_as_dense,
            "backward_passes_per_step": self._passes,
            "average_aggregated_gradients": self._average_aggregated,
            "op": int(self._reducer.op),
            "gradient_predivide_factor":
                self._reducer.gradient_predivide_factor,
            "groups": groups if isinstance(groups, int) else None,
            "scale_local_gradients": self._reducer.scale_local_gradients,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        # A deep copy: keras.optimizers.deserialize() edits its argument.
        config = copy.deepcopy(config)
        optimizer = keras.optimizers.deserialize(
            config.pop("optimizer"), custom_objects=custom_objects)
        config["compression"] = _compression_from_config(
            config.get("compression"))
        return cls(optimizer, **config)

    # A PowerSGD compressor's state (step, Q factors, errors) goes into the
    # optimizer's weights store under its own names, beside the numbered
    # optimizer variables that Keras saves.
    def save_own_variables(self, store):
        super().save_own_variables(store)
        compression = self._reducer.compression
        if isinstance(compression, PowerSGD):
            for name, value in compression.saved_arrays().items():
                store[name] = value

    def load_own_variables(self, store):
        names = list(store.keys())
        numbered = {name: store[name] for name in names if name.isdigit()}
        super().load_own_variables(numbered)
        saved = {name: store[name] for name in names
                 if name.startswith("powersgd.")}
        compression = self._reducer.compression
        if saved and isinstance(compression, PowerSGD):
            compression.restore_saved_arrays(
                {name: np.asarray(value) for name, value in saved.items()})


@keras.saving.register_keras_serializable(package="tfring")
class DistributedLossScaleOptimizer(DistributedOptimizer,
                                    _LossScaleOptimizer):
    """DistributedOptimizer around a keras LossScaleOptimizer.

    Made by DistributedOptimizer(opt) in mixed precision (see there); made
    directly, it wraps `optimizer` in a LossScaleOptimizer unless it is one.
    Gradients are reduced while still scaled, then the LossScaleOptimizer
    unscales them, tests them for inf/NaN (the same values on every rank)
    and updates its scale. Its state is readable here (`dynamic_scale`,
    `step_counter`, `initial_scale`, `dynamic_growth_steps`).
    """

    def __init__(self, optimizer, *args, **kwargs):
        if (isinstance(optimizer, _Optimizer) and not isinstance(
                optimizer, (_LossScaleOptimizer, DistributedOptimizer))):
            optimizer = _LossScaleOptimizer(optimizer,
                                            name="loss_scale_optimizer")
        super().__init__(optimizer, *args, **kwargs)

    @property
    def dynamic_scale(self):
        return self.inner_optimizer.dynamic_scale

    @property
    def step_counter(self):
        return self.inner_optimizer.step_counter

    @property
    def initial_scale(self):
        return self.inner_optimizer.initial_scale

    @property
    def dynamic_growth_steps(self):
        return self.inner_optimizer.dynamic_growth_steps

    def check_finite(self, grads):
        return self.inner_optimizer.check_finite(grads)

    def _agree_on_local_overflow(self, grads, variables):
        # The reduced gradients are the same on every rank, local ones are
        # not: one rank alone could find an inf/NaN and skip the step (and
        # halve its loss scale), and from then on the ranks would reduce
        # gradients scaled differently. So the ranks agree (Max of a flag)
        # and, if any local gradient overflowed anywhere, every rank sees a
        # NaN in its first local gradient and skips the step too.
        local = [i for i in sorted(self._reducer.local_positions(variables))
                 if grads[i] is not None]
        if not local or not self.process_set.included():
            # Outside the set every gradient is this rank's own, and the
            # set's ranks do not wait for it.
            return grads
        values = [grads[i].values if isinstance(grads[i], tf.IndexedSlices)
                  else grads[i] for i in local]
        overflow = tf.cast(tf.logical_not(
            self.inner_optimizer.check_finite(values)), tf.int32)
        overflow = collectives.allreduce(overflow, op=collectives.Max,
                                         process_set=self.process_set)
        grads = list(grads)
        first = grads[local[0]]
        poison = tf.where(overflow > 0, float("nan"), 0.0)
        if isinstance(first, tf.IndexedSlices):
            grads[local[0]] = tf.IndexedSlices(
                first.values + tf.cast(poison, first.values.dtype),
                first.indices, first.dense_shape)
        else:
            grads[local[0]] = first + tf.cast(poison, first.dtype)
        return grads


def PartialDistributedOptimizer(optimizer, name=None, device_dense='',
                                device_sparse='',
                                compression=Compression.none,
                                sparse_as_dense=False,
                                gradient_predivide_factor=1.0,
                                op=collectives.Average,
                                backward_passes_per_step=1,
                                average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set,
                                local_layers=None,
                                scale_local_gradients=True):
    """A DistributedOptimizer whose `local_layers` keep their gradients
    local (horovod.keras.PartialDistributedOptimizer, same parameters).

    local_layers: None, a keras Layer or a list of them; their trainable
    variables count as registered with register_local_var() (looked up at
    each step, so a model built after this call is fine). The other
    arguments are DistributedOptimizer's.
    """
    layers = _local.check_local_layers(
        local_layers, "tfring.keras.PartialDistributedOptimizer()")
    opt = DistributedOptimizer(
        optimizer, name, device_dense, device_sparse, compression,
        sparse_as_dense, gradient_predivide_factor, op,
        backward_passes_per_step, average_aggregated_gradients,
        groups=groups, process_set=process_set,
        scale_local_gradients=scale_local_gradients)
    opt._reducer.local_sources.add_layers(layers)
    return opt
