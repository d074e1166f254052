# What a PyTorch user can do to tensors and handles while collectives are
# in flight, at any number of ranks: drop a handle without synchronize()
# (never blocks, never frees memory the core still uses), resize or
# re-point a tensor in flight (refused with an error naming the
# collective, never a crash), resize the outputs of collectives afterwards
# (ordinary torch tensors), and submit a name already in flight (raises at
# once).

import gc
import time

import pytest
import torch

import tfring.torch as hvd
from tfring.torch import in_flight


@pytest.mark.requires_ranks(2)
def test_dropping_a_handle_neither_blocks_nor_frees_the_memory(rank, size):
    tensor = torch.full((1 << 18,), float(rank + 1))
    if rank == 0:
        started = time.monotonic()
        hvd.allreduce_async_(tensor, name="dropped", op=hvd.Sum)
        gc.collect()
        # The others submit only after a barrier that follows this drop:
        # a blocking drop would deadlock here.
        assert time.monotonic() - started < 0.5
        del tensor  # the core still writes it: its memory must stay valid
    hvd.barrier()
    if rank != 0:
        hvd.allreduce_async_(tensor, name="dropped", op=hvd.Sum)
    after = hvd.allreduce(torch.ones(3), name="after_dropped", op=hvd.Sum)
    assert after.tolist() == [float(size)] * 3
    # The core ran the dropped collectives first (in submission order), and
    # the memory they kept is let go at the next submission.
    hvd.allreduce(torch.ones(1), name="lets_go")
    assert not in_flight._orphans


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("change", ["resize_", "set_", "resize_as_",
                                    "view_resize", "storage_resize"])
def test_changing_memory_in_flight_is_refused(change, rank, size):
    tensor = torch.full((1 << 16,), float(rank + 1))
    if rank == 0:
        handle = hvd.allreduce_async_(tensor, name=f"in_flight.{change}",
                                      op=hvd.Sum)
        with pytest.raises(RuntimeError, match=(
                r"memory a collective in flight is still using "
                rf"\('allreduce.in_flight.{change}'\).*synchronize")):
            if change == "resize_":
                tensor.resize_(1 << 24)
            elif change == "set_":
                tensor.set_(torch.zeros(4).untyped_storage())
            elif change == "resize_as_":
                tensor.resize_as_(torch.zeros(1 << 24))
            elif change == "view_resize":
                tensor[10:20].resize_(1 << 24)
            else:
                tensor.untyped_storage().resize_(1 << 26)
        hvd.barrier()
    else:
        hvd.barrier()
        handle = hvd.allreduce_async_(tensor, name=f"in_flight.{change}",
                                      op=hvd.Sum)
    assert hvd.synchronize(handle) is tensor
    assert torch.all(tensor == sum(range(1, size + 1)))
    # Once synchronized, the tensor is the user's again.
    tensor.resize_(1 << 20)
    assert tensor.shape == (1 << 20,)


@pytest.mark.parametrize("elements", [100, 3 * 700_001])  # below/above 2 MiB
def test_outputs_are_ordinary_resizable_tensors(elements, rank, size):
    reduced = hvd.allreduce(torch.ones(elements), op=hvd.Sum)
    broadcast = hvd.broadcast(torch.ones(elements), root_rank=0)
    for result in (reduced, broadcast):
        result.resize_(2 * elements)
        result.resize_(0)  # reused as an out= tensor of another size
        torch.cat([torch.zeros(elements), torch.ones(elements + 1)],
                  out=result)
        assert result.shape == (2 * elements + 1,)
        assert float(result.sum()) == elements + 1


@pytest.mark.requires_ranks(2)
def test_second_submission_of_a_name_in_flight_raises_at_once(rank, size):
    tensor = torch.zeros(4)
    if rank == 0:
        first = hvd.allreduce_async(tensor, name="twice_in_flight")
        started = time.monotonic()
        with pytest.raises(ValueError, match="'allreduce.twice_in_flight' is "
                           "already in flight on this rank"):
            hvd.allreduce_async(tensor, name="twice_in_flight")
        assert time.monotonic() - started < 1.0
    hvd.barrier()
    if rank != 0:
        first = hvd.allreduce_async(tensor, name="twice_in_flight")
    hvd.synchronize(first)

