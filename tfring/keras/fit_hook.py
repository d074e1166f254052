# model.fit() with a tfring DistributedOptimizer never hangs on uneven data:
# it runs with a JoinUnevenDataCallback first in its callback list.
#
# Why this hook, after reading how Keras 3 (TensorFlow backend) drives an
# epoch: fit() builds its TFEpochIterator and its CallbackList itself, then
# per epoch runs `for ... in epoch_iterator: train_function(iterator)` inside
# `epoch_iterator.catch_stop_iteration()`. A rank leaves that loop in one of
# two ways: the iterator yields the number of batches the data adapter
# knows (tf.data with known cardinality, arrays, later epochs of a
# generator), or train_function raises OutOfRange/StopIteration (first
# epoch of data of unknown length; eagerly or in a tf.function). The first
# code that runs after the loop on every path is validation's
# callbacks.on_test_begin(), or else callbacks.on_epoch_end(); so a callback
# sees the end of the loop on every path, eager or traced, with any
# steps_per_execution, and nothing but validation (no collectives) ran on
# that rank in between. The alternatives were worse: wrapping
# model.train_function sees only the OutOfRange path (not the ends Keras
# counts itself), a replacement epoch iterator means patching a private
# Keras module, and the optimizer is never told which model it trains.
#
# Keras offers no hook through which the optimizer could add that callback,
# so importing tfring.keras (the package DistributedOptimizer's module is
# part of) wraps keras.Model.fit (public API, stable signature) once: for a
# model compiled with a DistributedOptimizer over all ranks of an initialized
# job of more than one rank, the callback is put in front of the user's
# callbacks (so it joins before they average metrics or
# save checkpoints); any other model's fit() is left exactly as it is.

import functools
import inspect

import keras

from tfring import basics
from tfring.keras.optimizer import DistributedOptimizer
from tfring.process_sets import global_process_set

_MARK = "_tfring_joins_uneven_data"


def _joins_uneven_data(model):
    optimizer = getattr(model, "optimizer", None)
    return (isinstance(optimizer, DistributedOptimizer)
            and optimizer.process_set is global_process_set
            and basics.is_initialized() and basics.size() > 1)


def _with_join_callback(callbacks):
    from tfring.keras.callbacks.join_uneven_data import (
        JoinUnevenDataCallback)
    if isinstance(callbacks, keras.callbacks.CallbackList):
        existing = callbacks.callbacks
    else:
        existing = list(callbacks or [])
    if any(isinstance(c, JoinUnevenDataCallback) for c in existing):
        return callbacks
    join_callback = JoinUnevenDataCallback()
    if isinstance(callbacks, keras.callbacks.CallbackList):
        join_callback.set_model(callbacks.model)
        join_callback.set_params(callbacks.params)
        existing.insert(0, join_callback)
        return callbacks
    return [join_callback] + existing


def install():
    """Wraps keras.Model.fit once (idempotent)."""
    fit = keras.Model.fit
    if getattr(fit, _MARK, False):
        return
    signature = inspect.signature(fit)

    @functools.wraps(fit)
    def fit_joining_uneven_data(self, *args, **kwargs):
        if _joins_uneven_data(self):
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["callbacks"] = _with_join_callback(
                bound.arguments.get("callbacks"))
            return fit(*bound.args, **bound.kwargs)
        return fit(self, *args, **kwargs)

    setattr(fit_joining_uneven_data, _MARK, True)
    keras.Model.fit = fit_joining_uneven_data
