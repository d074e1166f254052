# DistributedOptimizer where users go wrong or off the common path, at any
# number of ranks: zero_grad() between accumulated backward passes, a
# gradient set to None before step(), a wrapper dropped and the model
# wrapped again, a parameter of a group that some ranks do not use,
# channels_last models, parameters without gradients when the optimizer
# state is broadcast, and Horovod's warning for a step() after
# synchronize().

import gc
import warnings

import pytest
import torch

import tfring.torch as hvd


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1)).double()


def _batch(rank, rows=4):
    gen = torch.Generator().manual_seed(100 + rank)
    return (torch.randn(rows, 3, generator=gen, dtype=torch.float64),
            torch.randn(rows, 1, generator=gen, dtype=torch.float64))


def _loss(model, rank):
    x, y = _batch(rank)
    return torch.nn.functional.mse_loss(model(x), y)


def _wrap(model, **kwargs):
    return hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), **kwargs)


def _reference_step(size, lr=0.1, seed=0):
    """One process: one SGD step on the mean of every rank's gradient."""
    model = _model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    (sum(_loss(model, r) for r in range(size)) / size).backward()
    optimizer.step()
    return model


@pytest.mark.requires_ranks(2)  # one rank reduces nothing
def test_zero_grad_between_accumulated_passes_is_refused(rank, size):
    # Zeroing between the passes would silently throw the first one away.
    model = _model()
    optimizer = _wrap(model, backward_passes_per_step=2)
    _loss(model, rank).backward()
    with pytest.raises(AssertionError, match="zero_grad.*before "
                       "optimizer.step.*accumulated so far would be lost"):
        optimizer.zero_grad()
    _loss(model, rank).backward()
    optimizer.step()
    # Both passes counted: the step is twice the one-pass step.
    reference = _model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2)
    (sum(_loss(reference, r) for r in range(size)) / size).backward()
    reference_optimizer.step()
    for mine, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-9, atol=1e-12)


@pytest.mark.requires_ranks(2)
def test_gradient_set_to_none_before_step_says_what_happened(rank, size):
    model = _model()
    optimizer = _wrap(model)
    _loss(model, rank).backward()
    model.zero_grad()  # set_to_none, behind the optimizer's back
    expected = ("gradient of parameter '[0-9.a-z]+' was set to None.*"
                "model.zero_grad.*zero_grad\\(\\) before backward")
    with pytest.raises(AssertionError, match=expected):
        optimizer.step()
    # Nothing stays in flight: the next step trains.
    optimizer.zero_grad()
    _loss(model, rank).backward()
    optimizer.step()


@pytest.mark.requires_ranks(2)
def test_a_dropped_wrapper_lets_go_and_a_new_one_trains(rank, size):
    model = _model()
    first = _wrap(model)
    _loss(model, rank).backward()
    first.step()
    first.zero_grad()
    with pytest.raises(ValueError, match="another DistributedOptimizer, "
                       "still alive.*del optimizer"):
        _wrap(model)
    del first
    gc.collect()
    # A second wrapper of the same parameters: one allreduce per gradient
    # (with the old hooks still there, the second would be refused as
    # "already in flight").
    with torch.no_grad():
        for p, q in zip(model.parameters(), _model().parameters()):
            p.copy_(q)
    second = _wrap(model)
    second.zero_grad()
    _loss(model, rank).backward()
    second.step()
    for mine, want in zip(model.parameters(),
                          _reference_step(size).parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-9, atol=1e-12)


class _TwoBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(3, 1).double()
        self.b = torch.nn.Linear(3, 1).double()

    def forward(self, x, use_b):
        out = self.a(x)
        return out + self.b(x) if use_b else out


@pytest.mark.parametrize("groups", ["lists", 1])
def test_group_member_unused_on_some_ranks(groups, rank, size):
    # Rank 0 uses branch b, the others do not: every rank still reduces
    # b's gradient within its group (the others with zeros), no hang.
    model = _TwoBranches()
    group_arg = ([[model.a.weight, model.b.weight]] if groups == "lists"
                 else groups)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(), groups=group_arg,
        op=hvd.Sum)
    x, _ = _batch(rank)
    model(x, use_b=(rank == 0)).sum().backward()
    optimizer.synchronize()
    x0, _ = _batch(0)
    torch.testing.assert_close(model.b.weight.grad,
                               x0.sum(0, keepdim=True))
    expected_a = sum(_batch(r)[0].sum(0, keepdim=True) for r in range(size))
    torch.testing.assert_close(model.a.weight.grad, expected_a)
    with optimizer.skip_synchronize():
        optimizer.step()


def test_channels_last_model_trains_like_one_process(rank, size):
    def conv_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(3 * 4 * 4, 1)).double().to(
                memory_format=torch.channels_last)

    def images(r):
        gen = torch.Generator().manual_seed(7 + r)
        return torch.randn(2, 2, 6, 6, generator=gen,
                           dtype=torch.float64).to(
                               memory_format=torch.channels_last)

    model = conv_model()
    assert not model[0].weight.is_contiguous()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    model(images(rank)).square().mean().backward()
    optimizer.step()
    reference = conv_model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    (sum(reference(images(r)).square().mean() for r in range(size))
     / size).backward()
    reference_optimizer.step()
    for mine, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-9, atol=1e-12)
    # Out of place too: the result keeps the layout.
    weight = model[0].weight.detach()
    reduced = hvd.allreduce(weight, op=hvd.Sum)
    assert reduced.stride() == weight.stride()
    torch.testing.assert_close(reduced, weight * size)


def test_broadcast_state_of_parameters_without_gradients(rank, size):
    # As in Horovod: the state is created by a step with zero gradients,
    # which stay; a parameter that needs no gradient keeps none.
    class Indexed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.index = torch.nn.Parameter(torch.tensor([1, 3]).int(),
                                            requires_grad=False)
            self.values = torch.nn.Parameter(torch.rand(4))

        def forward(self, x):
            return torch.index_select(self.values, 0, self.index.long()) * x

    model = Indexed()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9,
                        nesterov=True, weight_decay=1e-6),
        named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert model.index.grad is None
    assert torch.equal(model.values.grad, torch.zeros(4))
    assert torch.equal(hvd.broadcast(model.values.grad, root_rank=0),
                       torch.zeros(4))


@pytest.mark.requires_ranks(2)
def test_step_after_synchronize_warns_in_horovods_words(rank, size):
    model = _model()
    optimizer = _wrap(model)
    _loss(model, rank).backward()
    optimizer.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()
    assert len(caught) == 1
    assert ("optimizer.step() called without optimizer.skip_synchronize()"
            in str(caught[0].message))
