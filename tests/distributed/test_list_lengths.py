# Lists of different lengths on different ranks (the ranks built different
# models): broadcast_variables() and the grouped collectives say so, on every
# rank, before any per-tensor dtype or shape message; the job goes on.

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfring


def _model(extra_layer):
    layers = [keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)]
    if extra_layer:
        layers.append(keras.layers.Dense(2, dtype="float64"))
    return keras.Sequential(layers)


def _expected_lengths(size, first, others, verb, noun):
    if size == 2:
        rest = f"rank 1 {verb}s {others} {noun}"
    else:
        ranks = ", ".join(str(r) for r in range(1, size))
        rest = f"ranks {ranks} {verb} {others} {noun}"
    return f"rank 0 {verb}s {first} {noun}, {rest}"


@pytest.mark.requires_ranks(2)
def test_broadcast_variables_of_different_models_names_the_counts(rank, size):
    model = _model(extra_layer=rank > 0)  # 4 variables on rank 0, 6 elsewhere
    with pytest.raises(ValueError) as raised:
        tfring.broadcast_variables(model.variables, root_rank=0)
    message = str(raised.value)
    assert _expected_lengths(size, 4, 6, "broadcast", "variables") in message
    assert "different models" in message
    assert "dtype" not in message
    # Nothing was broadcast; the job goes on.
    total = tfring.allreduce(tf.constant(1.0), op=tfring.Sum, name="after")
    assert float(total) == size


@pytest.mark.requires_ranks(2)
def test_grouped_allreduce_of_different_lengths_names_the_counts(rank, size):
    tensors = [tf.ones([2])] * (2 if rank == 0 else 3)
    with pytest.raises(ValueError) as raised:
        tfring.grouped_allreduce(tensors, name="uneven_lists")
    assert _expected_lengths(size, 2, 3, "reduce", "tensors") in str(
        raised.value)


@pytest.mark.requires_ranks(2)
def test_grouped_allgather_of_different_lengths_names_the_counts(rank, size):
    tensors = [tf.ones([1])] * (1 if rank == 0 else 2)
    with pytest.raises(ValueError,
                       match="rank 0 gathers 1 tensor, ") as raised:
        tfring.grouped_allgather(tensors, name="uneven_gather")
    assert "tfring.grouped_allgather()" in str(raised.value)


def test_equal_lengths_still_broadcast(rank, size):
    model = _model(extra_layer=False)
    for variable in model.variables:
        variable.assign(tf.fill(variable.shape, float(rank)))
    tfring.broadcast_variables(model.variables, root_rank=0)
    for variable in model.variables:
        np.testing.assert_array_equal(variable.numpy(), 0.0)
