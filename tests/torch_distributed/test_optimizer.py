# tfring.torch.DistributedOptimizer at any number of ranks: n ranks with
# batch b train to the weights of one process with batch n * b (SGD and
# Adam, float64, 1e-6), gradient allreduces start during backward (overlap),
# backward_passes_per_step, synchronize()/skip_synchronize(), groups,
# compression, zero_grad() misuse, join() with uneven data, and broadcasting
# parameters, optimizer state and objects.

import pytest
import torch

import tfring.torch as hvd

BATCH = 4
STEPS = 5


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8),
        torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()


def _data(step, size):
    """The global batch of `step`: size * BATCH samples, the same on every
    rank (rank r trains on rows [r * BATCH, (r + 1) * BATCH))."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size * BATCH, 6, generator=gen, dtype=torch.float64)
    y = torch.randn(size * BATCH, 2, generator=gen, dtype=torch.float64)
    return x, y


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("passes", [1, 2])
def test_n_ranks_match_one_process_with_n_times_the_batch(kind, passes, rank,
                                                          size):
    model = _model()
    optimizer = hvd.DistributedOptimizer(
        _make_optimizer(kind, model.parameters()),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes)
    reference = _model()
    reference_optimizer = _make_optimizer(kind, reference.parameters())
    for step in range(STEPS):
        x, y = _data(step, size * passes)
        # This rank: `passes` micro-batches of BATCH rows, losses scaled so
        # that their sum is the mean over its rows.
        optimizer.zero_grad()
        for p in range(passes):
            start = (rank * passes + p) * BATCH
            part = slice(start, start + BATCH)
            (_loss(model, x[part], y[part]) / passes).backward()
        optimizer.step()
        # One process, the whole batch at once.
        reference_optimizer.zero_grad()
        _loss(reference, x, y).backward()
        reference_optimizer.step()
    for mine, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-6, atol=1e-6)


@pytest.mark.requires_ranks(2)
def test_allreduces_start_during_backward(rank, size):
    """When backward reaches the first layer, the last layer's gradients have
    been handed to the core already (they would not, were allreduces started
    only in step())."""
    model = _model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    last_layer = set(model[4].parameters())
    started_when_first_layer_ran = []

    def record(_grad):
        started = [p for p, (handle, _) in optimizer._handles.items()
                   if handle is not None and p in last_layer]
        started_when_first_layer_ran.append(len(started))

    x, y = _data(0, size)
    hidden = model[0](x[:BATCH])
    hidden.register_hook(record)  # runs when backward reaches layer 0
    out = model[4](model[3](model[2](model[1](hidden))))
    torch.nn.functional.mse_loss(out, y[:BATCH]).backward()
    assert started_when_first_layer_ran == [len(last_layer)]
    optimizer.step()


@pytest.mark.requires_ranks(2)
def test_gradients_accumulated_more_than_allowed(rank, size):
    model = _model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    x, y = _data(0, size)
    _loss(model, x, y).backward()
    with pytest.raises(AssertionError,
                       match="more than backward_passes_per_step"):
        _loss(model, x, y).backward()
    optimizer.synchronize()


@pytest.mark.requires_ranks(2)
def test_zero_grad_between_backward_and_step_is_refused(rank, size):
    model = _model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    x, y = _data(0, size)
    _loss(model, x, y).backward()
    with pytest.raises(AssertionError, match="zero_grad.*before"):
        optimizer.zero_grad()
    optimizer.step()
    optimizer.zero_grad()


def test_synchronize_then_clip_then_step(rank, size):
    model = _model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    reference = _model()
    x, y = _data(0, size)
    _loss(model, x[rank * BATCH:(rank + 1) * BATCH],
          y[rank * BATCH:(rank + 1) * BATCH]).backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with optimizer.skip_synchronize():
        optimizer.step()
    _loss(reference, x, y).backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for mine, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("groups", [2, "lists"])
def test_groups_and_fp16_compression(groups, rank, size):
    model = _model()
    if groups == "lists":
        groups = [list(model[0].parameters()), list(model[4].parameters())]
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), groups=groups,
        compression=hvd.Compression.fp16)
    reference = _model()
    x, y = _data(0, size)
    _loss(model, x[rank * BATCH:(rank + 1) * BATCH],
          y[rank * BATCH:(rank + 1) * BATCH]).backward()
    optimizer.step()
    _loss(reference, x, y).backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for mine, want in zip(model.parameters(), reference.parameters()):
        assert mine.dtype == torch.float64
        torch.testing.assert_close(mine, want, rtol=1e-2, atol=1e-3)


def test_sum_op_and_predivide(rank, size):
    weight = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD([weight], lr=1.0), named_parameters=[("w", weight)],
        op=hvd.Sum)
    (weight * float(rank + 1)).sum().backward()
    optimizer.step()
    total = sum(r + 1 for r in range(size))
    assert torch.allclose(weight.detach(), torch.full((3,), -float(total),
                                                      dtype=torch.float64))
    weight2 = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD([weight2], lr=1.0), named_parameters=[("w2", weight2)],
        gradient_predivide_factor=2.0)
    (weight2 * float(rank + 1)).sum().backward()
    optimizer.step()
    assert torch.allclose(weight2.detach(), torch.full(
        (3,), -total / size, dtype=torch.float64))


def test_sparse_gradients(rank, size):
    for as_dense in (False, True):
        embedding = torch.nn.Embedding(5, 2, sparse=True).double()
        torch.nn.init.zeros_(embedding.weight)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(embedding.parameters(), lr=1.0),
            named_parameters=embedding.named_parameters(prefix=f"e{as_dense}"),
            sparse_as_dense=as_dense)
        embedding(torch.tensor([rank % 5])).sum().backward()
        optimizer.step()
        want = torch.zeros(5, 2, dtype=torch.float64)
        for r in range(size):
            want[r % 5] -= 1.0 / size
        assert torch.allclose(embedding.weight.detach(), want)


def test_bad_optimizer_arguments():
    model = _model()
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[("a", p) for p in model.parameters()])
    with pytest.raises(ValueError, match="miss"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=list(model.named_parameters())[:2])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 backward_passes_per_step=0)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 op=hvd.Adasum)


def test_wrapper_shares_state_with_the_optimizer_and_schedulers(rank, size):
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(
        inner, named_parameters=model.named_parameters())
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups is inner.param_groups
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1,
                                                gamma=0.5)
    x, y = _data(0, size)
    _loss(model, x[:BATCH], y[:BATCH]).backward()
    optimizer.step()
    scheduler.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(0.05)
    state = optimizer.state_dict()
    assert len(state["state"]) == len(list(model.parameters()))
    optimizer.load_state_dict(state)


def test_join_with_uneven_batches(rank, size):
    """Rank r has r + 1 batches; step k averages the gradients of the ranks
    that still have data, as one process computing that mean would."""
    model = _model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    for step in range(rank + 1):
        x, y = _data(step, size)
        optimizer.zero_grad()
        _loss(model, x[rank * BATCH:(rank + 1) * BATCH],
              y[rank * BATCH:(rank + 1) * BATCH]).backward()
        optimizer.step()
    last = hvd.join()
    assert last == size - 1 or size == 1
    reference = _model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(rank + 1):
        x, y = _data(step, size)
        active = range(step, size)  # ranks with a batch `step`
        rows = torch.cat([torch.arange(r * BATCH, (r + 1) * BATCH)
                          for r in active])
        reference_optimizer.zero_grad()
        _loss(reference, x[rows], y[rows]).backward()
        reference_optimizer.step()
    for mine, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-6, atol=1e-6)


def test_broadcast_parameters_optimizer_state_and_objects(rank, size):
    model = _model(seed=rank)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    root_model = _model(seed=0)
    for mine, want in zip(model.parameters(), root_model.parameters()):
        assert torch.equal(mine, want)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    assert all("exp_avg" in optimizer.state[p] for p in model.parameters())
    named = dict(model.named_parameters())
    hvd.broadcast_parameters(list(named.items()), root_rank=size - 1)

    obj = {"rank": rank, "values": [rank] * 3}
    assert hvd.broadcast_object(obj, root_rank=size - 1) == \
        {"rank": size - 1, "values": [size - 1] * 3}
    gathered = hvd.allgather_object(("rank", rank, "x" * rank))
    assert gathered == [("rank", r, "x" * r) for r in range(size)]


def test_broadcast_optimizer_state_of_a_resumed_distributed_optimizer(
        rank, size):
    # As when resuming from a checkpoint that only rank 0 loads: rank 0's
    # DistributedOptimizer has momentum buffers, the others have no state
    # yet. The others create theirs without reducing gradients (which rank 0
    # would never join), then receive rank 0's.
    model = _model(seed=rank)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    if rank == 0:
        for p in model.parameters():
            optimizer.state[p]["momentum_buffer"] = torch.full_like(p, 0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for p, want in zip(model.parameters(), _model(seed=0).parameters()):
        assert torch.equal(p, want)
        assert torch.equal(optimizer.state[p]["momentum_buffer"],
                           torch.full_like(p, 0.5))
    x, y = _data(0, size)
    optimizer.zero_grad()
    _loss(model, x[rank * BATCH:(rank + 1) * BATCH],
          y[rank * BATCH:(rank + 1) * BATCH]).backward()
    optimizer.step()


def test_objects_that_differ_in_type_between_ranks(rank, size):
    # The usual pattern: only the root has the object. The calls are
    # matched by call order, not by the object's type (which differs).
    config = {"lr": 0.1, "epochs": 3} if rank == 0 else None
    assert hvd.broadcast_object(config, root_rank=0) == {"lr": 0.1,
                                                         "epochs": 3}
    mixed = rank if rank % 2 else str(rank)
    assert hvd.allgather_object(mixed) == [
        r if r % 2 else str(r) for r in range(size)]


def test_sparse_allreduce_async_matches_the_dense_allreduce(rank, size):
    gen = torch.Generator().manual_seed(rank)
    dense = torch.rand(7, 3, generator=gen)
    dense[dense < 0.6] = 0
    expected = hvd.allreduce(dense, op=hvd.Average)
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.0",
                                        op=hvd.Average)
    result = handle()
    assert result.is_sparse
    torch.testing.assert_close(result.to_dense(), expected)
    with pytest.raises(ValueError, match="Expected a sparse COO tensor"):
        hvd.sparse_allreduce_async(dense, name="sparse.1", op=hvd.Average)
