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
from tfring.process_sets import global_process_set


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


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (anything cloudpickle can serialize) on every rank of
    the set. The other ranks' `obj` is not used (pass None there)."""
    basics._check_initialized("broadcast_object")
    name = _c.names.object_call("broadcast_object", name, process_set)
    if basics.rank() == root_rank:
        payload = _nd.from_numpy(_objects.to_bytes(obj))
        length = _nd.from_numpy(np.array([payload.size], dtype=np.int64))
    else:
        length = _nd.from_numpy(np.zeros(1, dtype=np.int64))
    _c.broadcast_(length, root_rank, name=f"{name}.sz", process_set=process_set)
    if basics.rank() != root_rank:
        payload = mx.nd.zeros((int(length.asnumpy()[0]),), ctx=mx.cpu(), dtype=np.uint8)
    _c.broadcast_(payload, root_rank, name=f"{name}.t", process_set=process_set)
    if basics.rank() == root_rank:
        return obj
    return _objects.from_bytes(payload.asnumpy())


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every set rank's `obj`, in rank order."""
    basics._check_initialized("allgather_object")
    name = _c.names.object_call("allgather_object", name, process_set)
    payload = _objects.to_bytes(obj)
    lengths = _c.allgather(_nd.from_numpy(np.array([payload.size], dtype=np.int64)),
                           name=f"{name}.sz", process_set=process_set).asnumpy()
    gathered = _c.allgather(_nd.from_numpy(payload), name=f"{name}.t",
                            process_set=process_set).asnumpy()
    return _objects.split_gathered(lengths, gathered)
