# Process sets with tfring.torch: collectives within a set of ranks, sets
# added and removed while running, a rank outside a set refused with a
# clear error, and a DistributedOptimizer averaging over a set (ranks
# outside it keep their own gradients, as in Horovod).

import pytest
import torch

import tfring.torch as hvd


@pytest.fixture
def dynamic_sets():
    """tfring restarted with process_sets="dynamic", and restored after."""
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    yield
    hvd.shutdown()
    hvd.init()


@pytest.mark.requires_ranks(2)
def test_collectives_in_a_set(dynamic_sets, rank, size):
    lower = hvd.add_process_set(hvd.ProcessSet(range(size - 1)))
    try:
        if lower.included():
            total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum,
                                  process_set=lower)
            assert float(total) == sum(range(size - 1))
            gathered = hvd.allgather(torch.tensor([rank]), process_set=lower)
            assert gathered.tolist() == list(range(size - 1))
            value = hvd.broadcast(torch.tensor([rank]), root_rank=0,
                                  process_set=lower)
            assert value.tolist() == [0]
            hvd.barrier(process_set=lower)
        else:
            with pytest.raises(ValueError, match="does not contain rank"):
                hvd.allreduce(torch.zeros(1), process_set=lower)
        # Global collectives keep working alongside.
        assert float(hvd.allreduce(torch.ones(1), op=hvd.Sum)) == size
    finally:
        hvd.remove_process_set(lower)
    with pytest.raises(ValueError):
        hvd.allreduce(torch.zeros(1), process_set=lower)


@pytest.mark.requires_ranks(2)
def test_optimizer_over_a_set(dynamic_sets, rank, size):
    # A set smaller than the job: [0, 1], or [0] at 2 ranks.
    members = [0, 1] if size > 2 else [0]
    pair = hvd.add_process_set(hvd.ProcessSet(members))
    try:
        weight = torch.nn.Parameter(torch.zeros(2))
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD([weight], lr=1.0),
            named_parameters=[("w", weight)], process_set=pair)
        (weight * float(rank + 1)).sum().backward()
        optimizer.step()
        if rank in members:
            expected = -sum(r + 1 for r in members) / len(members)
        else:
            expected = -float(rank + 1)  # its own gradient
        assert torch.allclose(weight.detach(), torch.full((2,), expected))
    finally:
        hvd.remove_process_set(pair)
