# Broadcasting a model's parameters, and Python objects, with horovod.mxnet's
# signatures.
#
# Why: every rank must start training from the same weights, and scripts
# exchange small Python values (epochs, metrics, file names). Parameters move
# in place, all submitted before any is waited for (so the core fuses them);
# a Gluon parameter not yet initialized (deferred initialization) is
# broadcast right after MXNet initializes it. Objects travel as pickled
# bytes (tfring.common.objects).

import types

import mxnet as mx
import numpy as np

from tfring import basics
from tfring.common import objects as _objects
from tfring.mxnet import collectives as _c
from tfring.mxnet import ndarrays as _nd


def _broadcast_after_init(parameter, root_rank, name):
    initialize = parameter._init_impl

    def init_then_broadcast(self, *args, **kwargs):
        initialize(*args, **kwargs)
        _c.broadcast_many_([self.data()], root_rank, [name], "broadcast_parameters")

    return types.MethodType(init_then_broadcast, parameter)


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Overwrites each parameter of `params` with root_rank's, in place.

    params: a Gluon ParameterDict (block.collect_params()), a dict of name ->
    Parameter or a dict of name -> NDArray (Module.get_params()), the same
    on every rank. prefix: distinguishes the names of several calls.
    """
    api_name = "broadcast_parameters"
    basics._check_initialized(api_name)
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(
            f"{api_name} received prefix={prefix!r} of type {type(prefix).__name__}. "
            "Expected a str (or None). Pass a string.")
    if not hasattr(params, "items"):
        raise ValueError(
            f"{api_name} received params of type {type(params).__name__}. Expected "
            "a Gluon ParameterDict (block.collect_params()) or a dict of name -> "
            "Parameter or NDArray. Pass one of those.")
    if basics.size() == 1:
        return
    arrays, names = [], []
    for name, value in sorted(params.items(), key=lambda item: str(item[0])):
        key = f"parameter.{prefix or ''}{name}"
        if isinstance(value, mx.gluon.Parameter):
            try:
                value = value.data()
            except mx.gluon.parameter.DeferredInitializationError:
                value._init_impl = _broadcast_after_init(value, root_rank, key)
                continue
        arrays.append(value)
        names.append(key)
    _c.broadcast_many_(arrays, root_rank, names, api_name)


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's `obj` (anything cloudpickle can serialize) on every rank."""
    api_name = "broadcast_object"
    basics._check_initialized(api_name)
    # Unnamed: numbered in call order, not named after the object's type
    # (Horovod's default), which only root_rank's object has.
    name = _c.names.name("broadcast_object", name, api_name, None)
    if basics.rank() == root_rank:
        data = _nd.from_numpy(_objects.to_bytes(obj))
        length = _nd.from_numpy(np.array([data.size], dtype=np.int64))
    else:
        data = None
        length = _nd.from_numpy(np.zeros(1, dtype=np.int64))
    _c.broadcast_(length, root_rank, name=f"{name}.length")
    if data is None:
        data = mx.nd.zeros((int(length.asnumpy()[0]),), ctx=mx.cpu(), dtype=np.uint8)
    _c.broadcast_(data, root_rank, name=f"{name}.bytes")
    if basics.rank() == root_rank:
        return obj
    return _objects.from_bytes(data.asnumpy())


def allgather_object(obj, name=None):
    """The list of every rank's `obj`, in rank order."""
    api_name = "allgather_object"
    basics._check_initialized(api_name)
    name = _c.names.name("allgather_object", name, api_name, None)
    data = _objects.to_bytes(obj)
    sizes = _c.allgather(_nd.from_numpy(np.array([data.size], dtype=np.int64)),
                         name=f"{name}.length").asnumpy()
    gathered = _c.allgather(_nd.from_numpy(data), name=f"{name}.bytes").asnumpy()
    return _objects.split_gathered(sizes, gathered)
