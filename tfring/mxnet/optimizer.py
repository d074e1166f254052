# DistributedOptimizer: horovod.mxnet's wrapper of an mx.optimizer.Optimizer
# that averages each gradient over the ranks before the wrapped optimizer
# updates its weight (for the Module API, and for Gluon through
# DistributedTrainer's base).
#
# Why a subclass that delegates: MXNet accepts only Optimizer instances
# (Module.init_optimizer, gluon.Trainer check the type), so it is one; every
# attribute it does not define is the wrapped optimizer's, whose state and
# hyper-parameters stay the user's object (attributes MXNet sets on the
# wrapper, such as a Trainer's rescale_grad, are set on it too).

import mxnet as mx

from tfring import reduce_args as _reduce_args
from tfring.mxnet import collectives as _c
from tfring.process_sets import global_process_set


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps `optimizer`: update() and update_multi_precision() first average
    the gradient over the ranks of `process_set` (in place; scaled by
    1/gradient_predivide_factor before the sum and gradient_predivide_factor
    after it), then call the wrapped optimizer's. `num_groups` is accepted for
    Horovod compatibility (the core fuses gradients on its own)."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=global_process_set):
        # No Optimizer.__init__: the wrapped optimizer holds the state.
        self._optimizer = optimizer
        self._gradient_predivide_factor = _reduce_args.check_scale_factor(
            gradient_predivide_factor, "gradient_predivide_factor", "DistributedOptimizer")
        self._process_set = process_set
        del num_groups

    _OWN = frozenset({"_optimizer", "_gradient_predivide_factor", "_process_set"})

    def __getattr__(self, item):
        return getattr(self.__dict__["_optimizer"], item)

    def __setattr__(self, name, value):
        # What MXNet sets on the optimizer it was given (a Trainer sets
        # rescale_grad every step, and param_dict) is the wrapped one's.
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _average(self, index, grad):
        if not self._process_set.included() or self._process_set.size() == 1:
            return
        indices = index if isinstance(index, (list, tuple)) else [index]
        grads = grad if isinstance(grad, (list, tuple)) else [grad]
        factor = self._gradient_predivide_factor
        for i, g in zip(indices, grads):
            _c.allreduce_(g, name=str(i), op=_c.Average, prescale_factor=1.0 / factor,
                          postscale_factor=factor, process_set=self._process_set)

    def update(self, index, weight, grad, state):
        self._average(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._average(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)
