# tfring.torch.SyncBatchNorm at any number of ranks: each rank normalizes
# its slice of one batch (slices of different sizes, some empty) and must
# get what torch.nn.BatchNorm gives on the whole batch in one process:
# output, input gradient, the sum over ranks of the weight and bias
# gradients, running statistics; eval mode; errors on every rank.

import pytest
import torch

import tfring.torch as hvd

REFERENCE_CLASSES = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d,
                     4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}
CHANNELS = 3


def _batch_sizes(size, first=2):
    """Uneven slices: rank r holds first + r rows."""
    return [first + r for r in range(size)]


def _whole_batch(sizes, spatial, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    shape = (sum(sizes), CHANNELS) + spatial
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    # Channels of different scales and offsets far from zero.
    offsets = torch.tensor([5.0, -300.0, 0.5], dtype=torch.float64)
    scales = torch.tensor([1.0, 20.0, 0.01], dtype=torch.float64)
    channel = (1, -1) + (1,) * len(spatial)
    values = values * scales.view(channel) + offsets.view(channel)
    upstream = torch.randn(shape, generator=generator, dtype=torch.float64)
    return values.to(dtype), upstream.to(dtype)


def _own_rows(tensor, sizes, rank):
    return tensor.narrow(0, sum(sizes[:rank]), sizes[rank])


def _layers(spatial, dtype, **options):
    """A SyncBatchNorm and the torch BatchNorm of the same rank, with the
    same non-trivial weight and bias."""
    reference = REFERENCE_CLASSES[2 + len(spatial)](CHANNELS, **options)
    synced = hvd.SyncBatchNorm(CHANNELS, **options)
    for layer in (reference, synced):
        layer.to(dtype)
        if layer.affine:
            with torch.no_grad():
                layer.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
                layer.bias.copy_(torch.tensor([0.1, -3.0, 4.0]))
    return synced, reference


def _step(synced, reference, sizes, spatial, dtype, seed, rank, tolerance):
    """One forward and backward of both layers; checks output, gradients."""
    whole, upstream = _whole_batch(sizes, spatial, dtype, seed)
    whole.requires_grad_(True)
    mine = _own_rows(whole, sizes, rank).detach().clone().requires_grad_(True)
    for layer in (synced, reference):
        layer.zero_grad()

    expected = reference(whole)
    (expected * upstream).sum().backward()
    output = synced(mine)
    (output * _own_rows(upstream, sizes, rank)).sum().backward()

    close = dict(rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(output, _own_rows(expected, sizes, rank),
                               **close)
    torch.testing.assert_close(mine.grad, _own_rows(whole.grad, sizes, rank),
                               **close)
    if synced.affine:
        for name in ("weight", "bias"):
            summed = hvd.allreduce(getattr(synced, name).grad, op=hvd.Sum,
                                   name=f"sync_bn_test.{name}")
            torch.testing.assert_close(summed,
                                       getattr(reference, name).grad, **close)


def _assert_same_running_statistics(synced, reference, tolerance):
    close = dict(rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(synced.running_mean, reference.running_mean,
                               **close)
    torch.testing.assert_close(synced.running_var, reference.running_var,
                               **close)
    assert int(synced.num_batches_tracked) == int(
        reference.num_batches_tracked)


@pytest.mark.parametrize("spatial", [(), (4,), (2, 3), (2, 2, 2)])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_matches_batch_norm_on_the_whole_batch(spatial, momentum,
                                                        rank, size):
    synced, reference = _layers(spatial, torch.float64, momentum=momentum)
    sizes = _batch_sizes(size)
    for seed in (1, 2):
        _step(synced, reference, sizes, spatial, torch.float64, seed, rank,
              1e-9)
    _assert_same_running_statistics(synced, reference, 1e-9)

    synced.eval()
    reference.eval()
    whole, _ = _whole_batch(sizes, spatial, torch.float64, seed=3)
    torch.testing.assert_close(synced(_own_rows(whole, sizes, rank)),
                               _own_rows(reference(whole), sizes, rank),
                               rtol=1e-9, atol=1e-9)
    # Eval mode leaves the running statistics alone.
    _assert_same_running_statistics(synced, reference, 1e-9)


def test_float32_and_no_affine(rank, size):
    synced, reference = _layers((5,), torch.float32, affine=False)
    _step(synced, reference, _batch_sizes(size), (5,), torch.float32, 4,
          rank, 1e-4)
    _assert_same_running_statistics(synced, reference, 1e-4)


def test_bfloat16_input(rank, size):
    # Statistics accumulate in float32; the output is bfloat16.
    synced, reference = _layers((4,), torch.float32)
    sizes = _batch_sizes(size)
    whole, _ = _whole_batch(sizes, (4,), torch.float32, seed=5)
    mine = _own_rows(whole, sizes, rank).to(torch.bfloat16)
    output = synced(mine)
    assert output.dtype == torch.bfloat16
    expected = reference(whole.to(torch.bfloat16).to(torch.float32))
    torch.testing.assert_close(output.float(),
                               _own_rows(expected, sizes, rank),
                               rtol=2e-2, atol=2e-2)


def test_without_running_statistics_eval_uses_batch_statistics(rank, size):
    synced, reference = _layers((3,), torch.float64,
                                track_running_stats=False)
    synced.eval()
    reference.eval()
    assert synced.running_mean is None
    _step(synced, reference, _batch_sizes(size), (3,), torch.float64, 6,
          rank, 1e-9)


def test_empty_batch_on_some_ranks(rank, size):
    # Rank 0 has no rows; the others cover the batch between them (at one
    # rank, rank 0 holds two rows).
    sizes = [0] + [2] * (size - 1) if size > 1 else [2]
    synced, reference = _layers((2,), torch.float64)
    _step(synced, reference, sizes, (2,), torch.float64, 7, rank, 1e-9)
    _assert_same_running_statistics(synced, reference, 1e-9)


def test_one_value_per_channel_over_all_ranks(rank):
    # Rank 0 holds the only row: no variance to normalize with.
    layer = hvd.SyncBatchNorm(CHANNELS)
    rows = 1 if rank == 0 else 0
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(torch.ones(rows, CHANNELS))
    # In eval mode the running statistics are used: no error.
    layer.eval()
    assert layer(torch.ones(rows, CHANNELS)).shape == (rows, CHANNELS)


def _still_works(size):
    result = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after_sync_bn")
    assert torch.equal(result, torch.full((2,), float(size)))


@pytest.mark.parametrize("bad_input,message", [
    (torch.ones(4), r"at least 2 dimensions \(N, C, ...\), got 1D input.*"
                    r"unsqueeze"),
    (torch.ones(4, CHANNELS + 1), rf"expected {CHANNELS} channels.*"
                                  rf"num_features={CHANNELS + 1}"),
    (torch.ones(4, CHANNELS, dtype=torch.int64), "floating-point.*float()"),
])
def test_bad_input_on_one_rank_raises_on_every_rank(bad_input, message, rank,
                                                    size):
    layer = hvd.SyncBatchNorm(CHANNELS)
    bad_rank = size - 1
    if rank == bad_rank:
        with pytest.raises(ValueError, match=message):
            layer(bad_input)
    else:
        with pytest.raises(ValueError, match=rf"rank\(s\) \[{bad_rank}\] "
                           "passed input it cannot use"):
            layer(torch.ones(4, CHANNELS))
    _still_works(size)


def test_converted_model_trains_like_one_process(rank, size):
    # A model with SyncBatchNorm under DistributedOptimizer: the weights after
    # a few SGD steps equal those of the same model with BatchNorm trained in
    # one process on the whole batch (DistributedOptimizer averages, so the
    # loss there is the mean of the ranks' summed losses).
    torch.manual_seed(0)
    def model(norm):
        return torch.nn.Sequential(torch.nn.Conv1d(2, CHANNELS, 3), norm,
                                   torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(CHANNELS * 4, 1)).double()
    reference = model(torch.nn.BatchNorm1d(CHANNELS))
    synced = model(hvd.SyncBatchNorm(CHANNELS))
    synced.load_state_dict(reference.state_dict())
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(synced.parameters(), lr=0.01),
        named_parameters=synced.named_parameters())
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)
    sizes = _batch_sizes(size)
    generator = torch.Generator().manual_seed(8)
    for _ in range(3):
        inputs = torch.randn(sum(sizes), 2, 6, generator=generator,
                             dtype=torch.float64)
        targets = torch.randn(sum(sizes), 1, generator=generator,
                              dtype=torch.float64)
        optimizer.zero_grad()
        loss = ((synced(_own_rows(inputs, sizes, rank))
                 - _own_rows(targets, sizes, rank)) ** 2).sum()
        loss.backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        (((reference(inputs) - targets) ** 2).sum() / size).backward()
        reference_optimizer.step()
    for (name, mine), want in zip(synced.state_dict().items(),
                                  reference.state_dict().values()):
        torch.testing.assert_close(mine, want, rtol=1e-9, atol=1e-9,
                                   msg=name)
