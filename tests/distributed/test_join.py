# tfring.join() with uneven data: every rank trains on its own number of
# batches, joins when out of data, and the result equals a single-process
# computation in which each step averages the gradients of the ranks that
# still had data. Also: join's return value, the errors of collectives other
# than allreduce while ranks have joined, and that the job goes on after.

import numpy as np
import pytest
import tensorflow as tf

import tfring

FEATURES = 3
BATCH = 4
LEARNING_RATE = 0.1


def _batches(rank):
    """Rank r holds r + 2 batches of a linear regression problem."""
    rng = np.random.default_rng(100 + rank)
    w_true = np.array([[1.0], [-2.0], [0.5]])
    batches = []
    for _ in range(rank + 2):
        x = rng.normal(size=(BATCH, FEATURES))
        y = x @ w_true + 0.01 * rng.normal(size=(BATCH, 1))
        batches.append((x, y))
    return batches


def _gradient(w, x, y):
    """d/dw of mean((x w - y)^2)."""
    return 2.0 * x.T @ (x @ w - y) / len(x)


def _reference_weights(size):
    """One process: step k averages the gradients of ranks with a batch k."""
    data = [_batches(r) for r in range(size)]
    w = np.zeros((FEATURES, 1))
    for k in range(max(len(d) for d in data)):
        grads = [_gradient(w, *d[k]) for d in data if k < len(d)]
        w = w - LEARNING_RATE * np.mean(grads, axis=0)
    return w


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_uneven_training_matches_single_process(mode, rank, size):
    w = tf.Variable(tf.zeros([FEATURES, 1], tf.float64))

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        tape = tfring.DistributedGradientTape(tape)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(LEARNING_RATE * grad)

    if mode == "function":
        step = tf.function(step)
    for x, y in _batches(rank):
        step(tf.constant(x), tf.constant(y))
    last = int(tfring.join())
    # The rank with the most batches finishes last.
    assert last == size - 1, f"join returned {last}"
    tfring.broadcast_variables([w], root_rank=last)
    np.testing.assert_allclose(w.numpy(), _reference_weights(size), rtol=1e-10,
                               err_msg=f"{mode} at {size} ranks")


def test_join_returns_the_last_rank_everywhere(rank, size):
    # Rank r waits r allreduces longer than rank 0 before joining; the
    # others take part in them as joined ranks.
    for step in range(rank):
        total = tfring.allreduce(tf.constant([1.0]), op=tfring.Sum,
                                 name=f"extra.{step}")
        # Ranks 0..step have joined; ranks step+1..size-1 contribute 1.
        assert float(total[0]) == size - step - 1, (step, float(total[0]))
    last = tfring.join()
    assert last.dtype == tf.int32
    assert int(last) == size - 1
    # Afterwards every rank contributes again.
    total = tfring.allreduce(tf.constant([1.0]), op=tfring.Sum, name="after")
    assert float(total[0]) == size


@pytest.mark.requires_ranks(2)
def test_other_collectives_fail_while_a_rank_has_joined(rank, size):
    # Rank 0 joins at once; the other ranks try a broadcast from rank 0 and
    # an allgather, which fail naming rank 0, then an Average allreduce that
    # divides by the ranks that contributed.
    if rank == 0:
        _check_last_joined(int(tfring.join()), first_to_join=0)
        return
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"rank 0 has joined.*root, rank 0, is one of them"):
        tfring.broadcast(tf.constant([1.0]), root_rank=0, name="from_joined")
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"allgather .*rank 0 has joined"):
        tfring.allgather(tf.constant([1.0]), name="gather_while_joined")
    averaged = tfring.allreduce(tf.constant([float(rank)]), name="avg")
    expected = np.mean(np.arange(1, size))
    assert float(averaged[0]) == pytest.approx(expected)
    _check_last_joined(int(tfring.join()), first_to_join=0)


def _check_last_joined(last, first_to_join):
    """The ranks other than `first_to_join` join in any order: every rank
    must report the same last rank, and not the one that joined first."""
    everyone = tfring.allgather(tf.constant([last]), name="last_joined")
    assert set(everyone.numpy().tolist()) == {last}, everyone.numpy()
    assert last != first_to_join, last
