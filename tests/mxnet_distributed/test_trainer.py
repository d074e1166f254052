"""DistributedTrainer and DistributedOptimizer train as one process would:
n ranks with batch b each end with the weights of one process that trains
on all n*b samples (average of the ranks' gradients = gradient of the
whole batch)."""

import mxnet as mx
import numpy as np
import pytest

import tfring.mxnet as hvd

STEPS = 4
BATCH = 3


def _data(size):
    rng = np.random.RandomState(42)
    x = rng.randn(STEPS, size * BATCH, 5).astype(np.float32)
    y = rng.randn(STEPS, size * BATCH, 2).astype(np.float32)
    return x, y


def _net(seed):
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, activation="tanh", in_units=5),
            mx.gluon.nn.Dense(2, in_units=4))
    net.initialize(mx.init.Xavier())
    return net


def _train(net, trainer, xs, ys):
    loss_fn = mx.gluon.loss.L2Loss()
    for x, y in zip(xs, ys):
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(x.shape[0])
    return [p.data().asnumpy() for _, p in sorted(net.collect_params().items())]


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_trainer_matches_one_process_with_the_whole_batch(compression, size, rank):
    x, y = _data(size)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    net = _net(seed=rank)  # different on each rank until broadcast
    hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix=f"trainer.{compression}.")
    trainer = hvd.DistributedTrainer(
        net.collect_params(), "sgd", {"learning_rate": 0.5},
        compression=getattr(hvd.Compression, compression), prefix=f"{compression}.")
    distributed = _train(net, trainer, x[:, mine], y[:, mine])

    reference = _net(seed=0)
    plain = mx.gluon.Trainer(reference.collect_params(), "sgd", {"learning_rate": 0.5},
                             kvstore=None)
    single = _train(reference, plain, x, y)
    tolerance = 1e-5 if compression == "none" else 2e-3
    for got, want in zip(distributed, single):
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_predivide_factor_gives_the_same_average(size, rank):
    x, y = _data(size)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    net = _net(seed=0)
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.5},
                                     gradient_predivide_factor=2.0, prefix="predivide.")
    distributed = _train(net, trainer, x[:, mine], y[:, mine])
    reference = _net(seed=0)
    plain = mx.gluon.Trainer(reference.collect_params(), "sgd", {"learning_rate": 0.5},
                             kvstore=None)
    for got, want in zip(distributed, _train(reference, plain, x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_distributed_optimizer_in_a_plain_trainer(size, rank):
    x, y = _data(size)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    net = _net(seed=0)
    optimizer = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.5))
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, kvstore=None)
    distributed = _train(net, trainer, x[:, mine], y[:, mine])
    reference = _net(seed=0)
    plain = mx.gluon.Trainer(reference.collect_params(), "sgd", {"learning_rate": 0.5},
                             kvstore=None)
    for got, want in zip(distributed, _train(reference, plain, x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert optimizer.learning_rate == 0.5  # the wrapped optimizer's attribute


def test_trainer_unwraps_a_distributed_optimizer():
    net = _net(seed=0)
    with pytest.warns(UserWarning, match="average the gradients a second time"):
        hvd.DistributedTrainer(net.collect_params(),
                               hvd.DistributedOptimizer(mx.optimizer.SGD()))


def test_two_trainers_with_prefixes(size, rank):
    """Two DistributedTrainers in one program, told apart by their prefixes
    (Horovod's test_two_trainer): every rank ends with the same weights."""
    nets = [mx.gluon.nn.Dense(units, in_units=10) for units in (20, 30)]
    trainers = []
    for i, net in enumerate(nets):
        mx.random.seed(rank)
        net.initialize(mx.init.Uniform())
        hvd.broadcast_parameters(net.collect_params(), prefix=f"two{i}.")
        trainers.append(hvd.DistributedTrainer(net.collect_params(), "sgd",
                                               {"learning_rate": 0.1}, prefix=f"two{i}."))
    for step in range(3):
        data = mx.nd.ones((5, 10)) * (rank + step)
        with mx.autograd.record():
            losses = [net(data).sum() for net in nets]
        mx.autograd.backward(losses)
        for trainer in trainers:
            trainer.step(1.0)
    for net in nets:
        gathered = hvd.allgather(net.weight.data().expand_dims(0)).asnumpy()
        for r in range(size):
            np.testing.assert_allclose(gathered[r], gathered[0], rtol=1e-6)


def test_distributed_optimizer_on_a_process_set(size, rank):
    """DistributedOptimizer(process_set=even ranks): the even ranks average
    among themselves, the others update with their own gradient."""
    if size < 2:
        pytest.skip("a process set other than the job's needs two ranks")
    even = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    try:
        optimizer = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0),
                                             process_set=even)
        weight = mx.nd.zeros((4,))
        grad = mx.nd.ones((4,)) * (rank + 1)
        optimizer.update(0, weight, grad, optimizer.create_state(0, weight))
        evens = [r + 1 for r in range(size) if r % 2 == 0]
        expected = -np.mean(evens) if rank % 2 == 0 else -(rank + 1.0)
        np.testing.assert_allclose(weight.asnumpy(), expected, rtol=1e-6)
    finally:
        hvd.remove_process_set(even)
