"""Keras model.fit with tfring.keras.elastic's state and callbacks, for
tests/test_elastic_frontends.py. Original rank KILL_RANK dies with SIGKILL
at the start of batch 2 of epoch 1. Usage: keras_fit.py KILL_RANK"""
import json
import os
import signal
import sys

import keras
import numpy as np

import tfring.keras as hvd

EPOCHS, BATCH = 3, 4
kill_rank = int(sys.argv[1])
hvd.init()
original_rank = hvd.rank()
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(
    keras.optimizers.SGD(0.05)))
x = np.arange(48, dtype="float32").reshape(16, 3) / 48.0
y = x.sum(axis=1, keepdims=True)
# Different initial weights per rank: sync() must make them the same.
model.set_weights([w + original_rank for w in model.get_weights()])
state = hvd.elastic.KerasState(model, epoch=0, batch=0)


class KillAt(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if original_rank == kill_rank and state.epoch == 1 and batch == 2:
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [KillAt(), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state),
             hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]


@hvd.elastic.run
def train(state):
    state.model.fit(x, y, batch_size=BATCH, epochs=EPOCHS - state.epoch,
                    shuffle=False, verbose=0, callbacks=callbacks)


train(state)
print("RESULT " + json.dumps({
    "original_rank": original_rank, "size": hvd.size(), "epoch": state.epoch,
    "weights": [w.tolist() for w in model.get_weights()]}), flush=True)
