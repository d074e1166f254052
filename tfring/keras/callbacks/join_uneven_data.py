# JoinUnevenDataCallback: ranks whose datasets yield different numbers of
# batches finish every epoch of model.fit() together.
#
# Why: a rank that runs out of batches leaves fit()'s training loop early.
# Without this callback it would go on to its epoch-end callbacks (metric
# averaging, checkpoints) while the other ranks still wait for its gradients
# in their next allreduce: the job stalls. With it, that rank calls
# tfring.join() instead, the first thing it does after its training loop
# (when validation starts, or else when the epoch ends): while joined it
# takes part in the other ranks' gradient allreduces with nothing, and
# Average divides by the ranks that contributed, as if the finished rank were
# not there. When every rank has joined, all of them leave join() together.
#
# The joined ranks skipped the last optimizer steps, so the ranks then
# compare their optimizer's step counts and, if they differ, take the model
# and optimizer state of the last rank to join (which ran every step). With
# even data the counts agree and nothing is broadcast.
#
# tfring.keras.DistributedOptimizer adds this callback to model.fit() by
# itself (tfring/keras/fit_hook.py); pass it yourself when training through
# fit() with another kind of gradient reduction (a custom train_step with
# tfring.DistributedGradientTape).

import keras
import numpy as np
import tensorflow as tf

from tfring import basics
from tfring import collectives
from tfring import functions
from tfring.joining import join
from tfring.keras.callbacks.broadcast_global_variables import (
    _optimizer_variables)


class JoinUnevenDataCallback(keras.callbacks.Callback):
    """Lets ranks with different numbers of batches per epoch train together.

    At the end of each epoch's training loop (before validation and before
    any other callback's epoch end), the rank calls tfring.join(), which
    returns once every rank has run out of batches. Until then the ranks
    still training average their gradients among themselves. Afterwards, if
    the ranks ran different numbers of optimizer steps, every rank takes the
    weights and optimizer state of the last rank to join.

    Only gradient allreduces can run while some ranks have joined: training
    steps that also allgather (tf.IndexedSlices gradients, e.g. from an
    Embedding) fail with an error naming the joined ranks; use
    DistributedOptimizer(..., sparse_as_dense=True) with uneven data.

    model.fit() adds this callback itself when the model is compiled with
    a tfring.keras.DistributedOptimizer over all ranks; passing it
    explicitly is only needed otherwise (e.g. a custom train_step with
    tfring.DistributedGradientTape).
    """

    def __init__(self):
        super().__init__()
        self._in_fit = False
        self._joined_this_epoch = True

    def on_train_begin(self, logs=None):
        basics._check_initialized("JoinUnevenDataCallback")
        self._in_fit = True

    def on_train_end(self, logs=None):
        self._in_fit = False

    def on_epoch_begin(self, epoch, logs=None):
        self._joined_this_epoch = False

    def on_test_begin(self, logs=None):
        # Inside fit(), validation starts right after the training loop.
        if self._in_fit:
            self._join_once()

    def on_epoch_end(self, epoch, logs=None):
        self._join_once()

    def _join_once(self):
        if self._joined_this_epoch:
            return
        self._joined_this_epoch = True
        last_rank = int(join())
        self._take_state_of(last_rank)

    def _take_state_of(self, last_rank):
        optimizer = self.model.optimizer
        iterations = getattr(optimizer, "iterations", None)
        if iterations is None:
            return
        steps = tf.reshape(tf.cast(iterations, tf.int64), [1])
        everyone = collectives.allgather(
            steps, name="tfring.join_uneven_data.optimizer_steps")
        if np.unique(everyone.numpy()).size == 1:
            return
        functions.broadcast_variables(
            _state_variables(self.model, optimizer), root_rank=last_rank)


def _state_variables(model, optimizer):
    """The model's weights and the optimizer's variables, each once."""
    seen = set()
    result = []
    for variable in list(model.weights) + _optimizer_variables(optimizer):
        if id(variable) not in seen:
            seen.add(id(variable))
            result.append(variable)
    return result
