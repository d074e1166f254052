# BroadcastGlobalVariablesCallback: every rank starts fit() from root's model
# weights and optimizer state.
#
# Why at train begin, and again after the first batch: data-parallel training
# equals single-process training on the combined batch only if step 1 already
# starts from identical weights, so the broadcast runs in on_train_begin. At
# that point Keras 3 (TensorFlow backend, no tf.distribute strategy) has not
# built the optimizer yet: it would create the slot variables while tracing the
# first train step. The callback builds it first, as Keras itself does under a
# distribution strategy, so optimizer state (including state restored on root
# only) is broadcast too. Anything that still appears during the first step
# (layers built lazily by their first call, variables an optimizer creates
# itself) is broadcast once more at the end of that first batch; variables
# already broadcast are not sent again, since by then they hold trained values
# that must not be overwritten (e.g. gradient accumulators).

import keras

from tfring import basics
from tfring import collectives
from tfring import functions
from tfring.process_sets import global_process_set


def _as_list(variables):
    if variables is None:
        return []
    if isinstance(variables, (list, tuple, set, frozenset)):
        return list(variables)
    return [variables]


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    variables = getattr(optimizer, "variables", [])
    if callable(variables):  # Keras 2 style optimizers: a method.
        variables = variables()
    return list(variables)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start training from `root_rank`'s state.

    Broadcasts the model's weights (trainable and non-trainable, e.g. batch
    normalization statistics) and the optimizer's variables (slots,
    iteration count, learning rate) from `root_rank` to every other rank.
    Use it whenever ranks could start differently: random initialization
    without a shared seed, or a checkpoint loaded on root only.

    When: in `on_train_begin`, after building the optimizer if Keras has not
    yet, so the first step already runs from identical weights. With
    gradients averaged across ranks (tfring.DistributedOptimizer), n ranks
    with batch b then follow the same trajectory as one process with batch
    n*b. Variables that do not exist yet at train begin (a model without an
    `Input` that builds on its first call) are broadcast at the end of the
    first batch; for such a model the first step itself starts from
    different weights, so build the model before `fit()` when exact
    single-process equivalence matters. The broadcast happens once per
    callback instance (the first `fit()` it is passed to).

    Random seed generator states (`model.variables` minus `model.weights`)
    are not broadcast: each rank keeps its own dropout and noise stream, as
    the samples of one large batch would in single-process training.

    Args:
        root_rank: the rank whose state every rank takes.
        device: accepted for Horovod compatibility and ignored (tfring's
            collectives run on host memory).
        local_variables: a variable or collection of variables that stay
            per rank and are not broadcast.
        process_set: broadcast only among the ranks of this
            tfring.ProcessSet (default: every rank); `root_rank` is then one
            of its job ranks, and only its ranks may use the callback.

    Example:

    ```python
    callbacks = [tfring.keras.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.fit(x, y, callbacks=callbacks)
    ```
    """

    def __init__(self, root_rank, device="", local_variables=None,
                 process_set=global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.process_set = process_set
        self._local_ids = set()
        for variable in _as_list(local_variables):
            if not hasattr(variable, "assign"):
                raise TypeError(
                    "BroadcastGlobalVariablesCallback(local_variables=...) "
                    f"received {variable!r} of type "
                    f"{type(variable).__name__}. Expected a variable "
                    "(keras.Variable or tf.Variable) or a list of them. "
                    "Pass the model's or optimizer's variables themselves, "
                    "e.g. local_variables=[model.layers[0].kernel].")
            self._local_ids.add(id(variable))
        self._broadcast_ids = None  # ids already broadcast; None: not begun.
        self._done = False

    def _global_variables(self):
        seen = set()
        result = []
        for variable in (list(self.model.weights)
                         + _optimizer_variables(self.model.optimizer)):
            key = id(variable)
            if key in seen or key in self._local_ids:
                continue
            seen.add(key)
            result.append(variable)
        return result

    def _broadcast(self, variables):
        functions.broadcast_variables(variables, self.root_rank,
                                      process_set=self.process_set)
        self._broadcast_ids.update(id(v) for v in variables)

    def on_train_begin(self, logs=None):
        if self._done:
            return
        api_name = "BroadcastGlobalVariablesCallback"
        basics._check_initialized(api_name)
        membership = collectives.resolve_process_set(self.process_set,
                                                     api_name)
        collectives.check_root_rank(self.root_rank, api_name, membership)
        optimizer = self.model.optimizer
        trainable = self.model.trainable_variables
        if (optimizer is not None and not getattr(optimizer, "built", True)
                and trainable and hasattr(optimizer, "build")):
            optimizer.build(trainable)
        self._broadcast_ids = set()
        self._broadcast(self._global_variables())

    def on_train_batch_end(self, batch, logs=None):
        if self._done:
            return
        self._done = True
        if self._broadcast_ids is None:  # on_train_begin was not called.
            self._broadcast_ids = set()
        self._broadcast([v for v in self._global_variables()
                         if id(v) not in self._broadcast_ids])
