# DistributedOptimizer: gradients averaged across ranks while backward runs.
#
# Why hooks: a gradient is final the moment autograd has accumulated it into
# `param.grad`, usually long before backward() returns (the last layers'
# gradients come first). A post-accumulate-grad hook on each parameter hands
# that gradient to the core at once (an in-place allreduce_async_), so the
# core's background thread moves it while autograd computes the rest; step()
# only waits for what is still in flight, then runs the wrapped optimizer.
# With backward_passes_per_step = k, gradients accumulate locally for k
# backward passes and are reduced on the k-th, as in Horovod.
#
# Why composition: the wrapper holds the user's optimizer and shares its
# param_groups and state (LR schedulers and state_dict() see the same
# objects); it is still a torch.optim.Optimizer, and attributes it does not
# define come from the wrapped optimizer. Horovod's behaviour otherwise:
# names from named_parameters key the allreduces, zero_grad() between
# backward() and step() is refused, synchronize() / skip_synchronize() let
# gradients be changed (clipped) between reduction and update.

import contextlib
import gc
import warnings
import weakref

import torch

from tfring import basics
from tfring.process_sets import global_process_set
from tfring.torch import collectives as _c
from tfring.torch.compression import Compression
from tfring.torch.functions import broadcast_object
from tfring.torch.handles import synchronize


def _duplicates(names):
    seen, dups = set(), set()
    for name in names:
        (dups if name in seen else seen).add(name)
    return sorted(dups)


def _split_evenly(items, count):
    """`items` cut into `count` consecutive runs of near-equal length."""
    size, extra = divmod(len(items), count)
    runs, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        if end > start:
            runs.append(items[start:end])
        start = end
    return runs


class _DistributedOptimizer(torch.optim.Optimizer):
    """Use DistributedOptimizer() to build one."""

    def __init__(self, optimizer, named_parameters, compression,
                 backward_passes_per_step, op, gradient_predivide_factor,
                 groups, sparse_as_dense, process_set):
        # torch.optim.Optimizer.__init__ is not called: the parameters, their
        # state and the hooks of optimizer.step() live in `optimizer`.
        self.__dict__["inner_optimizer"] = optimizer
        self._compression = compression
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.op = _c._reduce_args.resolve_op(op, None,
                                                "DistributedOptimizer")
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self._parameter_names = self._name_parameters(named_parameters)
        self._allreduce_delay = {p: self.backward_passes_per_step
                                 for p in self._parameter_names}
        self._handles = {}
        self._hook_handles = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = groups
        self._group_of = {}
        self._group_ready = {}
        if self.process_set.included() and basics.size() > 1:
            self._register_hooks()

    # --- the wrapped optimizer's state, shared ---------------------------

    def __getattr__(self, name):
        inner = self.__dict__.get("inner_optimizer")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def param_groups(self):
        return self.inner_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.inner_optimizer.param_groups = value

    @property
    def state(self):
        return self.inner_optimizer.state

    @state.setter
    def state(self, value):
        self.inner_optimizer.state = value

    @property
    def defaults(self):
        return self.inner_optimizer.defaults

    @defaults.setter
    def defaults(self, value):
        self.inner_optimizer.defaults = value

    def __repr__(self):
        return f"DistributedOptimizer({self.inner_optimizer!r})"

    def __getstate__(self):
        raise TypeError(
            "A DistributedOptimizer cannot be pickled or deep-copied (it holds "
            "hooks on the model's parameters). Save optimizer.state_dict() "
            "instead, and wrap a new optimizer after loading it.")

    def state_dict(self):
        return self.inner_optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self.inner_optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group):
        raise _c.unsupported(
            "DistributedOptimizer.add_param_group()",
            "parameters cannot be added after wrapping (their gradients would "
            "not be reduced). Expected every parameter group to be in the "
            "optimizer before DistributedOptimizer(). Add the group to the "
            "optimizer first, then wrap it.")

    # --- set-up ------------------------------------------------------------

    def _all_parameters(self):
        return [p for group in self.param_groups for p in group["params"]]

    def _name_parameters(self, named_parameters):
        if named_parameters is None:
            return {p: f"noname.{i}.{j}"
                    for i, group in enumerate(self.param_groups)
                    for j, p in enumerate(group["params"])}
        named_parameters = list(named_parameters)
        if any(not isinstance(item, tuple) or len(item) != 2
               for item in named_parameters):
            raise ValueError(
                "DistributedOptimizer received named_parameters that are not "
                "(name, parameter) tuples. Expected the pairs of "
                "model.named_parameters(). Pass "
                "named_parameters=model.named_parameters().")
        dups = _duplicates([name for name, _ in named_parameters])
        if dups:
            raise ValueError(
                "DistributedOptimizer received named_parameters with duplicate "
                f"names: {', '.join(map(str, dups))}. Expected unique names "
                "(they name the allreduces, the same on every rank). Pass "
                "model.named_parameters().")
        named = {id(p) for _, p in named_parameters}
        unnamed = [p for p in self._all_parameters() if id(p) not in named]
        if unnamed:
            raise ValueError(
                "DistributedOptimizer received named_parameters that miss "
                f"{len(unnamed)} of the optimizer's parameters (shapes "
                f"{[list(p.shape) for p in unnamed][:5]}). Expected a name "
                "for every parameter the optimizer updates. Pass the "
                "named_parameters() of the model the optimizer was built "
                "from.")
        return {p: name for name, p in named_parameters}

    def _form_groups(self, trainable):
        """Parameters reduced together (groups=): every rank orders them as
        rank 0 does, so the groups match across ranks."""
        names = broadcast_object([self._parameter_names[p] for p in trainable],
                                 root_rank=self.process_set.ranks[0],
                                 name="DistributedOptimizer.groups",
                                 process_set=self.process_set)
        position = {name: i for i, name in enumerate(names)}
        trainable = sorted(trainable,
                           key=lambda p: position[self._parameter_names[p]])
        if isinstance(self._groups, list):
            in_group = set()
            groups = []
            for group in self._groups:
                members = [p for p in group
                           if any(p is t for t in trainable)]
                in_group.update(id(p) for p in members)
                groups.append(members)
            groups += [[p] for p in trainable if id(p) not in in_group]
        else:
            groups = _split_evenly(trainable, self._groups)
        for group in groups:
            group = tuple(group)
            for p in group:
                self._group_of[p] = group
            self._group_ready[group] = 0

    def _register_hooks(self):
        trainable = [p for p in self._all_parameters() if p.requires_grad]
        _claim_parameters(self, trainable)
        if self._groups is not None:
            self._form_groups(trainable)
        # The hooks reach this optimizer through a weak reference, so that
        # the parameters do not keep it alive; when it goes, so do they.
        owner = weakref.ref(self)
        for p in trainable:
            self._requires_update.add(p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(
                lambda param, owner=owner: _run_hook(owner, param)))
        weakref.finalize(self, _remove_hooks, self._hook_handles)

    # --- reduction -----------------------------------------------------------

    def _scale_factors(self):
        if self.op == _c.Average:
            # The core divides by the set's size after postscaling.
            return (1.0 / self.gradient_predivide_factor,
                    self.gradient_predivide_factor)
        return 1.0, 1.0

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Another rank may have a gradient for it (a branch this rank's
            # forward did not take): take part with zeros.
            p.grad = torch.zeros_like(p.data)
        name = f"grad.{self._parameter_names[p]}"
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return _c.sparse_allreduce_async(
                    tensor, name=name, op=self.op,
                    process_set=self.process_set), None
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scale_factors()
        handle = _c.allreduce_async_(compressed, name=name, op=self.op,
                                     prescale_factor=pre,
                                     postscale_factor=post,
                                     process_set=self.process_set,
                                     compression=self._compression)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        for p in group:
            if p.grad is None:
                p.grad = torch.zeros_like(p.data)
        compressed = [self._compression.compress(p.grad) for p in group]
        pre, post = self._scale_factors()
        api_name = "DistributedOptimizer"
        # The ranks formed the groups alike (_form_groups): no length check,
        # which, synchronous, could not run inside backward hooks anyway.
        names = _c._grouped_names(
            "grouped_allreduce", f"grad.{self._parameter_names[group[0]]}",
            len(group), api_name, self.process_set, check_length=False)
        handle = _c._allreduce_async(
            [c for c, _ in compressed], True, names, self.op, None, pre, post,
            self.process_set, api_name, single=False,
            compression=self._compression)
        return handle, [ctx for _, ctx in compressed]

    def _on_gradient(self, p):
        """The hook's work: p's gradient has been accumulated."""
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than "
                "backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate "
                "gradients locally.")
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] > 0 or self._reduces_lists():
            # PowerSGD reduces every gradient at once in synchronize().
            self._handles[p] = (None, None)
            return
        if self._groups is None:
            self._handles[p] = self._allreduce_grad_async(p)
            return
        group = self._group_of[p]
        self._group_ready[group] += 1
        self._handles[p] = (None, None)
        if self._group_ready[group] == len(group):
            self._start_group(group)

    def _start_group(self, group):
        for member in group:
            self._handles.pop(member, None)
        self._handles[group] = self._grouped_allreduce_grad_async(group)
        self._group_ready[group] = 0

    def _set_grad(self, p, output, ctx):
        if p.grad is None:
            raise AssertionError(
                f"The gradient of parameter '{self._parameter_names[p]}' was "
                "set to None (model.zero_grad() or optimizer.zero_grad()) "
                "after loss.backward() and before optimizer.step(), while "
                "its allreduce was in flight: the averaged gradient has no "
                "tensor to go to. Expected zero_grad() before backward() or "
                "after step(). Move the zero_grad() call.")
        if isinstance(output, torch.Tensor) and output.is_sparse:
            p.grad = output
            return
        reduced = self._compression.decompress(output, ctx)
        if p.grad.is_sparse:
            p.grad = reduced.to_sparse()
        elif reduced is not p.grad:
            p.grad.copy_(reduced)

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those that have not
        started: parameters without a gradient this step, or still counting
        backward passes) and writes the results into param.grad."""
        if not self.process_set.included():
            self._synchronized = True
            return
        if self._reduces_lists():
            self._synchronize_whole_list()
            return
        started = set()
        for key, (handle, _) in self._handles.items():
            if handle is None:
                continue
            started.update(key if isinstance(key, tuple) else (key,))
        # Gradients not reduced yet (no gradient on this rank this step, or
        # still counting backward passes) go now, each the way every rank
        # sends it: a grouped parameter always within its whole group.
        for p in sorted(self._requires_update - started,
                        key=lambda q: self._parameter_names[q]):
            if p in started:
                continue
            if self._groups is None:
                self._handles.pop(p, None)
                self._handles[p] = self._allreduce_grad_async(p)
                continue
            group = self._group_of[p]
            started.update(group)
            self._start_group(group)
        # Every handle is waited for, even after a failure, so that nothing
        # stays in flight and the next step starts clean; the first failure
        # is raised at the end.
        failure = None
        for key, (handle, ctx) in list(self._handles.items()):
            try:
                if isinstance(key, tuple):
                    for p, output, c in zip(key, synchronize(handle), ctx):
                        self._set_grad(p, output, c)
                elif callable(handle):  # sparse_allreduce_async's
                    self._set_grad(key, handle(), None)
                else:
                    self._set_grad(key, synchronize(handle), ctx)
            except Exception as error:  # noqa: BLE001 (raised below)
                failure = failure or error
        for group in self._group_ready:
            self._group_ready[group] = 0
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        if failure is not None:
            raise failure
        self._synchronized = True

    def _reduces_lists(self):
        return getattr(self._compression, "reduces_gradient_lists", False)

    def _synchronize_whole_list(self):
        """synchronize() with a compressor of whole gradient lists (PowerSGD):
        every parameter's gradient (zeros where this rank has none), in the
        order of their names, identical on every rank."""
        params = sorted(self._requires_update, key=lambda q: self._parameter_names[q])
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p.data)
            elif p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        pre, post = self._scale_factors()
        reduced = self._compression.reduce_gradient_list(
            [p.grad for p in params], [self._parameter_names[p] for p in params],
            self.op, prescale_factor=pre, postscale_factor=post,
            process_set=self.process_set)
        with torch.no_grad():
            for p, g in zip(params, reduced):
                p.grad.copy_(g.reshape(p.grad.shape))
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Makes step() skip its synchronize(), for use after calling
        optimizer.synchronize() yourself (e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = int(passes)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's first words, which scripts and tests look for.
                warnings.warn(
                    "optimizer.step() called without "
                    "optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(): the gradients are reduced "
                    "twice, which slows training. Use `with "
                    "optimizer.skip_synchronize(): optimizer.step()` after "
                    "synchronize().")
            self.synchronize()
        self._synchronized = False
        return self.inner_optimizer.step(closure)

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but "
                "before optimizer.step() or optimizer.synchronize(): the "
                "gradients' allreduces are still writing into param.grad "
                "(or, with backward_passes_per_step > 1, the gradients "
                "accumulated so far would be lost). This is prohibited as it "
                "can cause a race condition. Call zero_grad() before "
                "backward() or after step().")
        return self.inner_optimizer.zero_grad(set_to_none=set_to_none)


def _run_hook(owner, param):
    optimizer = owner()
    if optimizer is not None:
        optimizer._on_gradient(param)


def _remove_hooks(hook_handles):
    for handle in hook_handles:
        handle.remove()


# Which DistributedOptimizer reduces each parameter's gradient, kept on the
# parameter (a weak reference): two live wrappers of one parameter would
# both start its allreduce, under one name.
_OWNER_ATTRIBUTE = "_tfring_distributed_optimizer"


def _claim_parameters(optimizer, parameters):
    def live_owner(p):
        owner = getattr(p, _OWNER_ATTRIBUTE, None)
        owner = owner() if owner is not None else None
        return owner if owner is not optimizer else None

    taken = [p for p in parameters if live_owner(p) is not None]
    if taken:
        gc.collect()  # a dropped wrapper in a reference cycle goes now
        taken = [p for p in taken if live_owner(p) is not None]
    if taken:
        names = [optimizer._parameter_names[p] for p in taken]
        raise ValueError(
            f"DistributedOptimizer() received {len(taken)} parameter(s) "
            f"({', '.join(names[:5])}) whose gradients another "
            "DistributedOptimizer, still alive, already reduces: both would "
            "start an allreduce of each gradient under the same name. "
            "Expected one live DistributedOptimizer per parameter. Delete "
            "the first one (`del optimizer`) before wrapping again, or keep "
            "using it.")
    for p in parameters:
        setattr(p, _OWNER_ATTRIBUTE, weakref.ref(optimizer))


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=Compression.none,
                         backward_passes_per_step=1, op=_c.Average,
                         gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a torch.optim optimizer so that step() applies gradients
    averaged (op) over the ranks of `process_set`.

    Each gradient's allreduce starts as soon as backward has produced it;
    step() waits for them. Arguments as in horovod.torch:
      named_parameters: model.named_parameters(), to name the allreduces.
      compression: Compression.none, Compression.fp16 (a cast to float16),
        Compression.bf16_wire / fp16_wire (encoded by the core only where
        gradients cross hosts), or a tfring.torch.PowerSGD.
      backward_passes_per_step: backward passes accumulated locally per
        reduction (and per step()).
      op: Average (default), Sum (also Min, Max, Product); Adasum is not
        implemented.
      gradient_predivide_factor: with Average, gradients are divided by it
        before the sum and multiplied by it (over size) after.
      num_groups / groups: reduce the parameters in that many grouped
        allreduces, or in the given lists of parameters.
      sparse_as_dense: reduce sparse gradients as dense tensors (otherwise
        they are allgathered).
      process_set: the ranks to average over; other ranks keep their own
        gradients.
    """
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError(
            "DistributedOptimizer() received an optimizer that is already a "
            "DistributedOptimizer. Expected a torch.optim optimizer. Wrap the "
            "original optimizer once.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"DistributedOptimizer() received {type(optimizer).__name__}. "
            "Expected a torch.optim.Optimizer. Pass e.g. "
            "torch.optim.SGD(model.parameters(), lr=0.01).")
    if int(backward_passes_per_step) < 1:
        raise ValueError(
            "DistributedOptimizer() received backward_passes_per_step="
            f"{backward_passes_per_step}. Expected an int >= 1. Pass 1 to "
            "reduce after every backward pass.")
    if gradient_predivide_factor != 1.0 and op != _c.Average:
        raise ValueError(
            "DistributedOptimizer() received gradient_predivide_factor="
            f"{gradient_predivide_factor} with an op other than Average. "
            "Expected op=Average for a predivide factor (as in Horovod). Pass "
            "op=hvd.Average or gradient_predivide_factor=1.0.")
    if num_groups and groups is not None:
        raise ValueError(
            "DistributedOptimizer() received both num_groups and groups. "
            "Expected at most one (num_groups is the deprecated form). Pass "
            "groups= only.")
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups=.",
                      DeprecationWarning, stacklevel=2)
        groups = num_groups
    if groups is not None:
        _check_groups(groups)
    basics._check_initialized("DistributedOptimizer")
    return _DistributedOptimizer(optimizer, named_parameters, compression,
                                 backward_passes_per_step, op,
                                 gradient_predivide_factor, groups,
                                 sparse_as_dense, process_set)


def _check_groups(groups):
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError(
                        "DistributedOptimizer() received groups containing "
                        f"{type(p).__name__}. Expected lists of the model's "
                        "parameters (torch.Tensor). Pass e.g. "
                        "groups=[[layer.weight, layer.bias]].")
                if id(p) in seen:
                    raise ValueError(
                        "DistributedOptimizer() received groups with a "
                        "parameter in more than one group. Expected each "
                        "parameter once. Remove the repetition.")
                seen.add(id(p))
        return
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError(
            f"DistributedOptimizer() received groups={groups!r}. Expected a "
            "positive int (the number of grouped allreduces) or a list of "
            "lists of parameters. Pass one of those.")
