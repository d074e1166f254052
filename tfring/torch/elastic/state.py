# The elastic state of a PyTorch model and optimizer.
#
# Why: commit() keeps copies of the model's and optimizer's state_dicts in
# memory, restore() loads them back, sync() broadcasts rank 0's; other
# attributes (`epoch=0`, a sampler) ride along as in ObjectState. Objects
# with a state_dict (a sampler, a scheduler) passed as keyword arguments are
# saved, restored and broadcast through their state_dict too.

import copy

from tfring.elastic.state import ObjectState
from tfring.torch import functions as _functions


def _has_state_dict(value):
    return hasattr(value, "state_dict") and hasattr(value, "load_state_dict")


class TorchState(ObjectState):
    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._handled = {name: value for name, value in kwargs.items()
                         if _has_state_dict(value)}
        plain = {name: value for name, value in kwargs.items()
                 if name not in self._handled}
        for name, value in self._handled.items():
            setattr(self, name, value)
        self._saved_dicts = self._dicts()
        super().__init__(**plain)

    def _objects(self):
        objects = dict(self._handled)
        if self.model is not None:
            objects["model"] = self.model
        if self.optimizer is not None:
            objects["optimizer"] = self.optimizer
        return objects

    def _dicts(self):
        return {name: copy.deepcopy(value.state_dict())
                for name, value in self._objects().items()}

    def save(self):
        self._saved_dicts = self._dicts()
        super().save()

    def restore(self):
        for name, value in self._objects().items():
            value.load_state_dict(copy.deepcopy(self._saved_dicts[name]))
        super().restore()

    def reset(self):
        # A sampler deals its samples over the new number of ranks.
        for value in self._handled.values():
            if hasattr(value, "reset"):
                value.reset()

    def sync(self):
        if self.model is not None:
            _functions.broadcast_parameters(self.model.state_dict(),
                                            root_rank=0)
        if self.optimizer is not None:
            _functions.broadcast_optimizer_state(self.optimizer, root_rank=0)
        for name, value in self._handled.items():
            value.load_state_dict(
                self._bcast_object(value.state_dict(), 0))
        self._saved_dicts = self._dicts()
        super().sync()

    def _snapshot(self):
        return dict(super()._snapshot(), state_dicts=self._saved_dicts)

    def _load_snapshot(self, snapshot):
        self._saved_dicts = snapshot["state_dicts"]
        super()._load_snapshot(snapshot)
