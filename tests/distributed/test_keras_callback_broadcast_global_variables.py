# BroadcastGlobalVariablesCallback at any number of ranks: differently seeded
# ranks end up with root's weights and optimizer state; with gradients
# averaged, n ranks x batch b follow one process x batch n*b exactly; lazily
# created variables are broadcast after the first batch; local_variables stay
# per rank.

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfring
from tfring.keras.callbacks import BroadcastGlobalVariablesCallback

BATCH = 4  # per rank
STEPS = 4  # per epoch (even: see backward_passes_per_step)


def _same_on_every_rank(arrays):
    gathered = tfring.allgather_object([np.asarray(a) for a in arrays])
    return all(len(g) == len(gathered[0]) and all(
        np.array_equal(a, b) for a, b in zip(g, gathered[0]))
        for g in gathered)


def _state(model):
    return ([v.numpy() for v in model.weights]
            + [v.numpy() for v in model.optimizer.variables])


class AveragingModel(keras.Model):
    """A functional model whose train step averages gradients over ranks."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True),
                                     training=True)
        tape = tfring.DistributedGradientTape(tape)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


def _model(seed, model_class=keras.Model, with_input=True):
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
    if not with_input:
        return keras.Sequential(layers)
    inputs = keras.Input((3,))
    outputs = layers[1](layers[0](inputs))
    return model_class(inputs, outputs)


def _optimizer(kind):
    if kind == "sgd":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    return keras.optimizers.Adam(0.01)


def _full_data(size):
    """STEPS combined batches of size*BATCH samples, the same on every
    rank."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(STEPS * size * BATCH, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)
         + 0.3).astype(np.float32)
    return x, y


def _shard(array, size, rank):
    """Rank's part of every combined batch: its rows
    [rank*BATCH, (rank+1)*BATCH)."""
    per_step = array.reshape(STEPS, size, BATCH, -1)
    return per_step[:, rank].reshape(STEPS * BATCH, -1)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_ranks_start_from_root_and_match_one_process(kind, size, rank):
    root = size - 1
    x, y = _full_data(size)
    model = _model(100 + rank, AveragingModel)  # different start per rank
    model.compile(optimizer=_optimizer(kind), loss="mse")
    model.fit(_shard(x, size, rank), _shard(y, size, rank), batch_size=BATCH,
              epochs=2, shuffle=False, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(root)])
    assert _same_on_every_rank(_state(model))

    # One process, root's initial weights, the combined batch of every step.
    reference = _model(100 + root)
    reference.compile(optimizer=_optimizer(kind), loss="mse")
    reference.fit(x, y, batch_size=size * BATCH, epochs=2, shuffle=False,
                  verbose=0)
    for got, want in zip(_state(model), _state(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.requires_ranks(2)
def test_without_the_callback_ranks_keep_their_own_weights(size, rank):
    x, y = _full_data(size)
    model = _model(100 + rank, AveragingModel)
    model.compile(optimizer=_optimizer("sgd"), loss="mse")
    model.fit(_shard(x, size, rank), _shard(y, size, rank), batch_size=BATCH,
              epochs=1, shuffle=False, verbose=0)
    assert not _same_on_every_rank([v.numpy() for v in model.weights])


def test_variables_created_in_the_first_step_are_broadcast(size, rank):
    # No Input: the layers and Adam's slots appear while the first step is
    # traced, so only the broadcast after the first batch can align them.
    # The data differ per rank and the optimizer is a plain one, so without
    # that broadcast the ranks would differ after the step.
    model = _model(100 + rank, with_input=False)
    model.compile(optimizer=_optimizer("adam"), loss="mse")
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(BATCH, 3)).astype(np.float32)
    callback = BroadcastGlobalVariablesCallback(0)
    model.fit(x, x[:, :1] * (rank + 1), batch_size=BATCH, epochs=1,
              verbose=0, callbacks=[callback])
    assert len(model.optimizer.variables) == 2 + 2 * 4  # iteration, lr, m, v
    assert _same_on_every_rank(_state(model))
    if size > 1:  # The per-rank step happened: root's result won.
        gathered = tfring.allgather_object(float(model.optimizer.variables[2]
                                                 .numpy().sum()))
        assert len(set(gathered)) == 1


def test_root_optimizer_state_reaches_every_rank_except_local(size, rank):
    model = _model(100 + rank)
    model.compile(optimizer=_optimizer("adam"), loss="mse")
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(BATCH * (rank + 1), 3)).astype(np.float32)
    model.fit(x, x[:, :1], batch_size=BATCH, epochs=1, verbose=0)
    # Now weights, slots and the iteration count differ per rank.
    local = model.layers[-1].bias
    local_before = local.numpy()
    callback = BroadcastGlobalVariablesCallback(0, local_variables=local)
    callback.set_model(model)
    callback.on_train_begin()
    others = [v for v in model.weights if v is not local]
    assert _same_on_every_rank([v.numpy() for v in others]
                               + [v.numpy() for v in
                                  model.optimizer.variables])
    assert int(model.optimizer.iterations.numpy()) == 1  # root's count
    np.testing.assert_array_equal(local.numpy(), local_before)
    if size > 1:
        assert not _same_on_every_rank([local.numpy()])
    # Once per callback: a second fit does not broadcast again.
    callback.on_train_batch_end(0)
    model.layers[1].kernel.assign(model.layers[1].kernel + rank)
    callback.on_train_begin()
    callback.on_train_batch_end(0)
    assert size == 1 or not _same_on_every_rank(
        [model.layers[1].kernel.numpy()])


@pytest.mark.parametrize("passes", [1, 2])
def test_with_distributed_optimizer(passes, size, rank):
    # With backward_passes_per_step=2 the wrapper keeps per-rank gradient
    # sums between steps; they must not be overwritten by root's after the
    # first batch, or the result would differ from one process.
    distributed = getattr(tfring, "DistributedOptimizer", None)
    if distributed is None:
        pytest.skip("tfring.DistributedOptimizer is not available yet")
    x, y = _full_data(size)
    model = _model(100 + rank)
    model.compile(optimizer=distributed(
        _optimizer("sgd"), backward_passes_per_step=passes,
        average_aggregated_gradients=True), loss="mse")
    model.fit(_shard(x, size, rank), _shard(y, size, rank), batch_size=BATCH,
              epochs=2, shuffle=False, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(0)])
    assert _same_on_every_rank(_state(model))
    # One process: root's start, batches of all ranks' `passes` batches.
    reference = _model(100)
    reference.compile(optimizer=_optimizer("sgd"), loss="mse")
    reference.fit(x, y, batch_size=passes * size * BATCH, epochs=2,
                  shuffle=False, verbose=0)
    for got, want in zip([v.numpy() for v in model.weights],
                         [v.numpy() for v in reference.weights]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_local_variables_must_be_variables():
    with pytest.raises(TypeError, match=r"Expected a variable"):
        BroadcastGlobalVariablesCallback(0, local_variables=[1.0])
