# Local gradients: sources whose gradients are not reduced over the ranks
# (Horovod's register_local_source / register_local_var, and the
# local_layers of PartialDistributedGradientTape and
# PartialDistributedOptimizer).
#
# Why: in model-parallel parts of a model (an embedding table sharded by
# rank, a per-rank head) each rank owns different weights, so averaging
# their gradients would mix unrelated values. Such gradients stay on their
# rank. As in Horovod 0.28, they are divided by the process set's size
# (scale_local_gradients=True, the default): the global gradients are
# averages, i.e. every rank's contribution is weighted by 1/size, and the
# local gradient gets the same weight (Horovod PR #3695).
#
# Why one registry for the tape and the Keras optimizer: both decide per
# gradient() / apply() call which positions stay local, the same way.

import numbers

import keras
import tensorflow as tf


def _identity(source):
    """What makes two sources the same: the object itself, except that a
    keras.Variable and the tf.Variable that holds its value are the same
    source (Keras' TensorFlow optimizer treats them alike too)."""
    if isinstance(source, keras.Variable):
        backing = getattr(source, "_value", None)
        if isinstance(backing, tf.Variable):
            return id(backing)
    return id(source)


def _is_source(source):
    return isinstance(source, (tf.Variable, keras.Variable, tf.Tensor))


def check_local_layers(local_layers, api_name):
    """Horovod's local_layers rule: None (no layer), one keras Layer or a
    collection of them. Returns a list of layers."""
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        return [local_layers]
    if (isinstance(local_layers, (str, bytes, dict))
            or not hasattr(local_layers, "__iter__")):
        layers = None
    else:
        layers = list(local_layers)
    bad = ([local_layers] if layers is None else
           [layer for layer in layers
            if not isinstance(layer, keras.layers.Layer)])
    if bad:
        # ValueError, as in Horovod, so except clauses written for it work.
        raise ValueError(
            f"{api_name} received local_layers={local_layers!r}, with "
            f"{bad[0]!r} of type {type(bad[0]).__name__}. Expected a "
            "keras.layers.Layer or a list of them (whose trainable "
            "variables keep their gradients local). Pass e.g. "
            "local_layers=[model.layers[0]]; for single variables use "
            "register_local_source() / register_local_var().")
    return layers


class LocalSources:
    """The variables (or watched tensors) whose gradients stay local.

    Holds the registered sources themselves (so their ids stay valid) and
    the local layers, whose trainable variables are looked up on every
    call: a layer registered before it is built (an optimizer made before
    the model's first call) still counts once it has variables.
    """

    def __init__(self):
        self._sources = []
        self._layers = []

    def add_source(self, source, api_name, what="source"):
        if isinstance(source, keras.layers.Layer):
            raise TypeError(
                f"{api_name} received the layer {source.name!r}. Expected "
                f"one {what}: a variable (tf.Variable or keras.Variable) or "
                "a watched tensor. Register each of its variables "
                "(for v in layer.trainable_variables: ...), or pass the "
                "layer as local_layers= to PartialDistributedGradientTape / "
                "PartialDistributedOptimizer.")
        if not _is_source(source):
            raise TypeError(
                f"{api_name} received {source!r} of type "
                f"{type(source).__name__}. Expected one {what}: a variable "
                "(tf.Variable or keras.Variable) or a watched tensor. Pass "
                "the variable itself, e.g. model.layers[0].kernel; call it "
                "once per variable for several.")
        self._sources.append(source)

    def add_layers(self, layers):
        """`layers`: already checked with check_local_layers()."""
        self._layers.extend(layers)

    def copy(self):
        other = LocalSources()
        other._sources = list(self._sources)
        other._layers = list(self._layers)
        return other

    def __bool__(self):
        return bool(self._sources or self._layers)

    def positions(self, sources):
        """The positions in the flat list `sources` that are local."""
        if not self:
            return frozenset()
        local = {_identity(s) for s in self._sources}
        for layer in self._layers:
            local.update(_identity(v) for v in layer.trainable_variables)
        return frozenset(i for i, s in enumerate(sources)
                         if _identity(s) in local)


def scale(gradient, size):
    """Horovod's scaling of a local gradient: divided by the process set's
    size (the values of an IndexedSlices)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / float(size),
                                gradient.indices, gradient.dense_shape)
    return gradient / float(size)


def check_scale_flag(value, api_name):
    if not isinstance(value, (bool, numbers.Integral)) or value not in (0, 1):
        raise TypeError(
            f"{api_name} received scale_local_gradients={value!r}. Expected "
            "True (divide local gradients by the process set's size, as "
            "Horovod does) or False (leave them as computed).")
    return bool(value)
