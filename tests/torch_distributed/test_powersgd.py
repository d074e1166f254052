# tfring.torch.PowerSGD through DistributedOptimizer at any number of ranks:
# each rank holds its own share of a least-squares problem; rank-1 PowerSGD
# with error feedback gets as close to the optimum as uncompressed training
# in as many steps, with identical weights on every rank; before start_iter
# it is exactly the plain average; its state survives state_dict() /
# load_state_dict() (through torch.save).

import copy

import pytest
import torch

import tfring.torch as hvd

ROWS, FEATURES, OUTPUTS = 24, 10, 6


def _problem(rank):
    generator = torch.Generator().manual_seed(77 + rank)
    a = torch.randn(ROWS, FEATURES, generator=generator)
    truth = torch.randn(FEATURES, OUTPUTS, generator=torch.Generator().manual_seed(5))
    return a, a @ truth + 0.3 * torch.randn(ROWS, OUTPUTS, generator=generator)


def _global_loss(weight):
    parts = [_problem(r) for r in range(hvd.size())]
    return sum(float(((a @ weight - b) ** 2).mean()) for a, b in parts) / len(parts)


def _train(compression, steps, model=None):
    a, b = _problem(hvd.rank())
    if model is None:
        model = torch.nn.Linear(FEATURES, OUTPUTS, bias=False)
        torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    for _ in range(steps):
        opt.zero_grad()
        ((a @ model.weight.T - b) ** 2).mean().backward()
        opt.step()
    return model.weight.detach().T.contiguous()


def test_error_feedback_gets_as_close_as_plain_training():
    powersgd = hvd.PowerSGD(rank=1, start_iter=3)
    w = _train(powersgd, 300)
    plain = _train(hvd.Compression.none, 300)
    assert _global_loss(w) <= _global_loss(plain) * 1.05, (_global_loss(w), _global_loss(plain))
    gathered = hvd.allgather(w[None])
    for other in gathered:
        assert torch.equal(other, w)
    if hvd.size() > 1:
        assert powersgd.step == 300 and list(powersgd.factors) == ["weight"]


def test_before_start_iter_it_is_the_plain_average():
    compressed = _train(hvd.PowerSGD(rank=1, start_iter=5), 3)
    plain = _train(hvd.Compression.none, 3)
    assert torch.equal(compressed, plain)
    powersgd = hvd.PowerSGD(rank=1)
    assert powersgd.matrix_shape(torch.zeros(7)) is None
    assert powersgd.matrix_shape(torch.zeros(2, 2)) is None
    assert powersgd.matrix_shape(torch.zeros(64, 3, 3)) == (64, 9, 1)


def test_state_survives_state_dict(tmp_path):
    powersgd = hvd.PowerSGD(rank=1, start_iter=1)
    _train(powersgd, 4)
    path = tmp_path / f"powersgd{hvd.rank()}.pt"
    torch.save(powersgd.state_dict(), path)
    restored = hvd.PowerSGD(rank=1, start_iter=1)
    restored.load_state_dict(torch.load(path))
    assert restored.step == powersgd.step
    assert restored.factors.keys() == powersgd.factors.keys()
    for key in powersgd.factors:
        assert torch.equal(restored.factors[key], powersgd.factors[key])
        assert torch.equal(restored.errors[key], powersgd.errors[key])
    # Training goes on from the restored state exactly as from the original.
    model = torch.nn.Linear(FEATURES, OUTPUTS, bias=False)
    twin = copy.deepcopy(model)
    assert torch.equal(_train(powersgd, 2, model), _train(restored, 2, twin))


def test_a_single_tensor_is_refused():
    with pytest.raises(TypeError, match="compresses the gradients of a whole model"):
        hvd.allreduce(torch.ones(4, 4), compression=hvd.PowerSGD())
    with pytest.raises(ValueError, match="Expected an integer of at least 1"):
        hvd.PowerSGD(rank=0)
