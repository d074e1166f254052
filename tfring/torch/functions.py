# Broadcasting a model's and an optimizer's state, and Python objects.
#
# Why: every rank must start training from the same weights and optimizer
# state, and scripts exchange small Python values (epochs, metrics, file
# names). These are horovod.torch's helpers: tensors move in place with
# broadcast_async_ (all submitted, then waited for, so the core fuses them);
# objects are pickled into byte tensors (cloudpickle, as Horovod does).

import torch

from tfring import basics
from tfring.common import objects as _objects
from tfring.process_sets import global_process_set
from tfring.torch import collectives as _c
from tfring.torch.autograd_functions import allgather
from tfring.torch.handles import synchronize


def _named_tensors(params, api_name):
    if isinstance(params, dict):
        return sorted(params.items(), key=lambda item: str(item[0]))
    if isinstance(params, list) or hasattr(params, "__next__"):
        return [p if isinstance(p, tuple) else (None, p) for p in params]
    raise ValueError(
        f"{api_name} received params of type {type(params).__name__}. "
        "Expected a state_dict (dict of name -> tensor), a list of tensors or "
        "the (name, parameter) pairs of model.named_parameters(). Pass one of "
        "those.")


def broadcast_parameters(params, root_rank, prefix=None):
    """Overwrites each tensor of `params` with root_rank's, in place.

    params: model.state_dict(), model.named_parameters(), or a list of
    tensors or (name, tensor) pairs (the same on every rank).
    """
    handles = []
    for index, (name, tensor) in enumerate(
            _named_tensors(params, "broadcast_parameters")):
        if not isinstance(tensor, torch.Tensor):
            continue
        key = f"{prefix or ''}{name if name is not None else index}"
        handles.append(_c.broadcast_async_(tensor.data, root_rank,
                                           name=f"parameter.{key}"))
    for handle in handles:
        synchronize(handle)


def _create_missing_state(optimizer):
    """Gives a fresh optimizer its state (Adam's moments, ...) by one step
    with zero gradients, so that every rank has the same state tensors to
    receive into. The parameters keep their values; as in Horovod, those
    stepped keep the zero gradients (parameters without requires_grad keep
    no gradient)."""
    saved = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p not in optimizer.state:
                saved.append((p, p.data.clone()))
                p.grad = torch.zeros_like(p.data)
    if not saved:
        return
    _unwrapped(optimizer).step()
    for p, data in saved:
        p.data.copy_(data)


def _unwrapped(optimizer):
    """The torch optimizer that a DistributedOptimizer wraps, else
    `optimizer`: a DistributedOptimizer's step() reduces gradients, which
    would wait for ranks whose state is complete and so never step here."""
    # By its attribute, not its class: optimizer.py imports this module.
    return getattr(optimizer, "inner_optimizer", optimizer)


def broadcast_optimizer_state(optimizer, root_rank, prefix="Parameter.",
                              model=None):
    """Makes every rank's `optimizer` state and hyper-parameters root_rank's:
    state tensors in place, other values (step counts, learning rates, ...)
    as objects. Call it after broadcast_parameters()."""
    del model  # Horovod's argument for models with tied parameters.
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError(
            "broadcast_optimizer_state() received a torch.optim.LBFGS, whose "
            "state cannot be broadcast (as in Horovod). Expected another "
            "optimizer. Broadcast the model's parameters only.")
    _create_missing_state(optimizer)
    tensors, values = [], {}
    for g, group in enumerate(optimizer.param_groups):
        values[f"group.{g}"] = {k: v for k, v in group.items()
                                if k != "params"}
        for i, p in enumerate(group["params"]):
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                name = f"{prefix}{g}.{i}.{key}"
                if torch.is_tensor(value):
                    tensors.append((name, value))
                else:
                    values[name] = value
    broadcast_parameters(tensors, root_rank)
    values = broadcast_object(values, root_rank,
                              name="broadcast_optimizer_state")
    for g, group in enumerate(optimizer.param_groups):
        group.update(values[f"group.{g}"])
        for i, p in enumerate(group["params"]):
            state = optimizer.state.get(p, {})
            for key in list(state):
                name = f"{prefix}{g}.{i}.{key}"
                if name in values:
                    state[key] = values[name]


def broadcast_object(obj, root_rank=0, name=None,
                     process_set=global_process_set):
    """Returns root_rank's `obj` (any picklable object) on every rank of the
    set. The other ranks' `obj` is not used (pass None there)."""
    name = _c._names.object_call("broadcast_object", name, process_set)
    if basics.rank() == root_rank:
        payload = torch.from_numpy(_objects.to_bytes(obj))
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    _c.broadcast_(length, root_rank, name=f"{name}.sz",
                  process_set=process_set)
    if basics.rank() != root_rank:
        payload = torch.empty(int(length), dtype=torch.uint8)
    _c.broadcast_(payload, root_rank, name=f"{name}.t",
                  process_set=process_set)
    if basics.rank() == root_rank:
        return obj
    return _objects.from_bytes(payload.numpy())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every set rank's `obj`, in rank order."""
    name = _c._names.object_call("allgather_object", name, process_set)
    payload = torch.from_numpy(_objects.to_bytes(obj))
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                        name=f"{name}.sz", process_set=process_set)
    gathered = allgather(payload, name=f"{name}.t", process_set=process_set)
    return _objects.split_gathered(lengths.tolist(), gathered.numpy())
