# Elastic states for TensorFlow variables and Keras models.
#
# Why: rolling back and handing on a model means copying its variables (and
# the optimizer's) in memory at commit(), assigning them back at restore(),
# and broadcasting rank 0's values at sync(); these classes do that through
# tfring's own broadcast, as Horovod's TensorFlowState and
# TensorFlowKerasState do.

import tensorflow as tf

from tfring import functions as _functions
from tfring.elastic.state import ObjectState


def _values(variables):
    return [tf.identity(v).numpy() if hasattr(v, "numpy") else
            tf.convert_to_tensor(v).numpy() for v in variables]


def _assign(variables, values):
    for variable, value in zip(variables, values):
        variable.assign(value)


class _SavedValuesState(ObjectState):
    """An ObjectState that also saves variables' values (_saved_values), in
    the commit a host keeps on disk too."""

    def _snapshot(self):
        return dict(super()._snapshot(), variables=self._saved_values)

    def _load_snapshot(self, snapshot):
        self._saved_values = snapshot["variables"]
        super()._load_snapshot(snapshot)


class TensorFlowState(_SavedValuesState):
    """`variables` (default: none) plus any attributes given as keyword
    arguments (`epoch=0`), kept consistent across ranks."""

    def __init__(self, variables=None, **kwargs):
        self.variables = list(variables or [])
        self._saved_values = _values(self.variables)
        super().__init__(**kwargs)

    def save(self):
        self._saved_values = _values(self.variables)
        super().save()

    def restore(self):
        _assign(self.variables, self._saved_values)
        super().restore()

    def sync(self):
        if self.variables:
            _functions.broadcast_variables(self.variables, root_rank=0)
        self._saved_values = _values(self.variables)
        super().sync()


def _optimizer_variables(optimizer, model):
    if optimizer is None:
        return []
    # Keras 3 optimizers create their slots when first applied; build them
    # now so every rank (a new one too) holds the same variables.
    if not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)
    return list(optimizer.variables)


class TensorFlowKerasState(_SavedValuesState):
    """A Keras `model` and its `optimizer` (default: model.optimizer), plus
    any attributes given as keyword arguments (`epoch=0, batch=0`)."""

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(
            model, "optimizer", None)
        self._saved_values = _values(self._variables())
        super().__init__(**kwargs)

    def _variables(self):
        return list(self.model.variables) + _optimizer_variables(
            self.optimizer, self.model)

    def save(self):
        self._saved_values = _values(self._variables())
        super().save()

    def restore(self):
        _assign(self._variables(), self._saved_values)
        super().restore()

    def sync(self):
        variables = self._variables()
        if variables:
            _functions.broadcast_variables(variables, root_rank=0)
        self._saved_values = _values(variables)
        super().sync()
