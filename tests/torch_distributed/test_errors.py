# tfring.torch errors at any number of ranks: what one rank can get wrong
# alone fails in Python before C++ with a message that says what, what was
# expected and how to fix it; what ranks disagree about fails in
# synchronize() on every rank with HorovodInternalError naming the tensor,
# the field and which ranks held which value; collectives work afterwards.

import pytest
import torch

import tfring.torch as hvd


def _still_works(size):
    result = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after_error")
    assert torch.equal(result, torch.full((2,), float(size)))


def test_tensor_with_gaps():
    gapped = torch.arange(12.0).view(3, 4)[:, :2]
    with pytest.raises(ValueError, match=r"strides \[4, 1\].*not one "
                       "contiguous block.*tensor.contiguous"):
        hvd.allreduce(gapped)
    with pytest.raises(ValueError, match="not one contiguous block"):
        hvd.allreduce_async_(gapped)
    with pytest.raises(ValueError, match="not one contiguous block"):
        hvd.broadcast_(gapped, 0)
    # allgather concatenates along dimension 0: only a contiguous tensor.
    transposed = torch.arange(6.0).view(2, 3).t()
    with pytest.raises(ValueError, match="expected a contiguous tensor"):
        hvd.allgather(transposed)


def test_tensor_not_on_the_cpu():
    tensor = torch.zeros(2, device="meta")
    with pytest.raises(ValueError, match="'meta' device.*no data"):
        hvd.allreduce(tensor)
    with pytest.raises(ValueError, match="'meta' device"):
        hvd.broadcast_(tensor, 0)


def test_unsupported_dtypes():
    # ValueError, as in Horovod.
    with pytest.raises(ValueError, match="complex64.*cannot move.*Expected "
                       "one of"):
        hvd.allgather(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="int16.*cannot reduce"):
        hvd.allreduce(torch.zeros(2, dtype=torch.int16))
    with pytest.raises(TypeError, match="Expected a torch.Tensor"):
        hvd.allreduce([1.0, 2.0])


def test_sparse_tensor():
    sparse = torch.zeros(3, 3).to_sparse()
    with pytest.raises(ValueError, match="layout.*to_dense"):
        hvd.allreduce(sparse)


def test_bad_arguments(size):
    with pytest.raises(ValueError, match=f"root_rank={size}.*only {size} "
                       "ranks"):
        hvd.broadcast(torch.zeros(1), root_rank=size)
    with pytest.raises(ValueError, match="reducescatter does not implement"):
        hvd.reducescatter(torch.zeros(size), op=hvd.Max)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.zeros(1), op=hvd.Adasum)
    with pytest.raises(TypeError, match="Expected a str"):
        hvd.allreduce(torch.zeros(1), name=3)
    with pytest.raises(TypeError, match="Expected the handle"):
        hvd.synchronize(7)
    with pytest.raises(TypeError, match="splits"):
        hvd.alltoall(torch.zeros(size), splits="a")
    _still_works(size)


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("field", ["shape", "dtype", "op", "root"])
def test_mismatch_fails_on_every_rank(field, rank, size):
    name = f"mismatch_{field}"
    with pytest.raises(hvd.HorovodInternalError) as caught:
        if field == "shape":
            hvd.allreduce(torch.zeros(2 if rank == 0 else 3), name=name)
        elif field == "dtype":
            hvd.allreduce(torch.zeros(2, dtype=torch.float32 if rank == 0
                                      else torch.float64), name=name)
        elif field == "op":
            hvd.allreduce(torch.zeros(2), name=name,
                          op=hvd.Sum if rank == 0 else hvd.Max)
        else:
            hvd.broadcast(torch.zeros(2), root_rank=0 if rank == 0 else 1,
                          name=name)
    message = str(caught.value)
    assert name in message, message
    assert "rank 0" in message, message
    assert isinstance(caught.value, RuntimeError)
    _still_works(size)


@pytest.mark.requires_ranks(2)
def test_alltoall_bad_splits_fail_on_every_rank(rank, size):
    splits = [1] * size
    if rank == 1:
        splits[0] = 5  # more rows than the tensor has
    with pytest.raises(hvd.HorovodInternalError, match="split") as raised:
        hvd.alltoall(torch.zeros(size), splits=splits, name="bad_splits")
    # Also a ValueError on every rank, the type Horovod raises for them.
    assert isinstance(raised.value, ValueError)
    uneven = torch.zeros(size + 1)
    with pytest.raises(ValueError, match="invalid splits.*evenly"):
        hvd.alltoall(uneven, name="uneven_rows")
    _still_works(size)


@pytest.mark.requires_ranks(2)
def test_duplicate_name_in_flight(rank, size):
    # Rank 0's first "twice" stays in flight until the others submit theirs,
    # which they do only after rank 0 has tried the name again.
    from mpi4py import MPI
    tensor = torch.zeros(4)
    if rank == 0:
        first = hvd.allreduce_async(tensor, name="twice")
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce_async(tensor, name="twice")
        MPI.COMM_WORLD.Barrier()
    else:
        MPI.COMM_WORLD.Barrier()
        first = hvd.allreduce_async(tensor, name="twice")
    hvd.synchronize(first)
    _still_works(size)


def test_not_initialized_after_shutdown(size):
    hvd.shutdown()
    try:
        with pytest.raises(ValueError, match="shut down.*init"):
            hvd.allreduce(torch.zeros(1))
        with pytest.raises(ValueError, match="shut down"):
            hvd.rank()
    finally:
        hvd.init()
    _still_works(size)


@pytest.mark.requires_ranks(2)
@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter"])
def test_grouped_lists_of_different_lengths_fail_on_every_rank(kind, rank,
                                                               size):
    count = 3 if rank == size - 1 else 2
    tensors = [torch.ones(size * 2) for _ in range(count)]
    call = {"allreduce": hvd.grouped_allreduce,
            "allgather": hvd.grouped_allgather,
            "reducescatter": hvd.grouped_reducescatter}[kind]
    with pytest.raises(ValueError, match=(
            f"lists of different lengths: ranks? .* 2 tensors, rank {size - 1} "
            "passes 3 tensors.*same tensors, in the same order")):
        call(tensors, name=f"uneven_lists.{kind}")
    _still_works(size)


@pytest.mark.requires_ranks(2)
def test_calls_refused_while_a_rank_has_joined_do_not_shift_later_names(
        rank, size):
    # The ranks that have not joined make an unnamed allgather the joined
    # rank does not: it fails on them, and the unnamed calls after join()
    # still pair up on every rank (each kind of call counts its own).
    for first in range(size):
        if rank == first:
            last = hvd.join()
        else:
            # A rank that was refused first may join before this rank's
            # call is refused, so the message may name it too.
            with pytest.raises(hvd.HorovodInternalError,
                               match=f"ranks? [0-9, ]*\\b{first}\\b[0-9, ]* "
                               "ha(s|ve) joined \\(hvd.join\\(\\)\\).*"
                               "only allreduce"):
                hvd.allgather(torch.ones(2, 2))
            last = hvd.join()
        assert hvd.allgather_object(last) == [last] * size
        assert hvd.broadcast_object(last if rank == 0 else None) == last
    _still_works(size)
