# DistributedTrainer: horovod.mxnet's gluon.Trainer whose step() averages
# every gradient over the ranks before the optimizer updates the weights.
#
# Why it submits all gradients as one group before waiting for any: the
# core then negotiates them in one round and fuses them into few large
# allreduces (one per fusion buffer) instead of one round trip per
# parameter; MXNet has finished computing each gradient
# (wait_to_read) before the core reads it, and the step updates the weights
# only after every reduced gradient is back.

import warnings

import mxnet as mx

from tfring import reduce_args as _reduce_args
from tfring.common import outcome as _outcome
from tfring.mxnet import collectives as _c
from tfring.mxnet import ndarrays as _nd
from tfring.mxnet.compression import Compression
from tfring.mxnet.optimizer import DistributedOptimizer
from tfring.process_sets import global_process_set


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon.Trainer (kvstore=None) whose gradients are averaged over the
    ranks of `process_set` at every step().

    compression: Compression.none (default) or Compression.fp16, applied to
      the gradients while they travel.
    gradient_predivide_factor: gradients are scaled by
      1/gradient_predivide_factor before the sum and by
      gradient_predivide_factor/size after it.
    prefix: distinguishes the gradients' names when several trainers run in
      one program (different prefixes, the same on every rank).
    num_groups: accepted for Horovod compatibility (the core fuses).
    """

    def __init__(self, params, optimizer, optimizer_params=None,
                 compression=Compression.none, gradient_predivide_factor=1.0,
                 prefix=None, num_groups=0, process_set=global_process_set):
        api_name = "DistributedTrainer"
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn(
                "DistributedTrainer received a DistributedOptimizer, whose updates "
                "would average the gradients a second time; the optimizer it wraps "
                "is used instead. Pass the plain optimizer.", stacklevel=2)
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(
                f"{api_name} received prefix={prefix!r} of type {type(prefix).__name__}. "
                "Expected a str (or None). Pass a string.")
        factor = _reduce_args.check_scale_factor(
            gradient_predivide_factor, "gradient_predivide_factor", api_name)
        # The same parameter order on every rank (Horovod sorts lists; dicts
        # keep their order).
        if isinstance(params, (list, tuple)):
            params = sorted(params, key=lambda p: p.name)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._compression = compression
        self._process_set = process_set
        self._predivide = factor
        self._prefix = prefix or ""
        del num_groups

    def _allreduce_grads(self):
        if not self._process_set.included() or self._process_set.size() == 1:
            return
        fields = _c.allreduce_fields(_c.Average, None, 1.0 / self._predivide, self._predivide,
                                     self._process_set, "DistributedTrainer.step")
        names, sent, dtypes, contexts, targets = [], [], [], [], []
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = param.list_grad()[0]
            compressed, context = self._compression.compress(grad)
            dtypes.append(_nd.check_array(compressed, "DistributedTrainer.step", reduction=True))
            names.append(f"allreduce.{self._prefix}{i}")
            sent.append(compressed)
            contexts.append(context)
            targets.append(grad)
        # One group: the core negotiates and fuses the step's gradients in
        # one round instead of one round per parameter.
        pending = _c.submit_async(_c._CollectiveType.allreduce, names, sent, dtypes, sent,
                                  **fields)
        _outcome.wait_all(pending)
        for grad, compressed, context in zip(targets, sent, contexts):
            if compressed is not grad:
                grad[:] = self._compression.decompress(compressed, context)
