# tfring.torch collectives at any number of ranks: every collective and
# every dtype torch and the core share, synchronous and asynchronous, in
# place and not, grouped, zero-size and scalar tensors, and process sets.
# Values are small integers, exact in every dtype, and depend on the rank so
# that a wrong rank order or a missing rank shows.

import pytest
import torch

import tfring.torch as hvd
from tfring.torch import dtypes

REDUCIBLE = sorted(dtypes.REDUCIBLE_DTYPES, key=str)
ALL = sorted(dtypes.CORE_DTYPES, key=str)
FLOATS = [d for d in REDUCIBLE if d.is_floating_point]


def _values(rank, dtype, shape=(2, 3)):
    """(rank + 1) * [0, 1, 2, 0, 1, 2, ...] in `dtype` (0/1 for bool)."""
    count = 1
    for d in shape:
        count *= d
    base = torch.arange(count) % 3
    if dtype == torch.bool:
        return ((base + rank) % 2 == 1).reshape(shape)
    return ((rank + 1) * base).to(dtype).reshape(shape)


def _expected_reduction(op, size, dtype, shape=(2, 3)):
    ranks = [_values(r, torch.float64, shape) for r in range(size)]
    stacked = torch.stack(ranks)
    if op == hvd.Sum:
        result = stacked.sum(0)
    elif op == hvd.Average:
        result = stacked.mean(0)
    elif op == hvd.Min:
        result = stacked.min(0).values
    elif op == hvd.Max:
        result = stacked.max(0).values
    else:
        result = stacked.prod(0)
    return result.to(dtype)


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max, hvd.Product])
def test_allreduce_every_dtype_and_op(dtype, op, rank, size):
    tensor = _values(rank, dtype)
    before = tensor.clone()
    result = hvd.allreduce(tensor, op=op)
    assert result.dtype == dtype
    assert torch.equal(result, _expected_reduction(op, size, dtype))
    assert torch.equal(tensor, before)  # not modified


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_allreduce_average_is_the_default(dtype, rank, size):
    result = hvd.allreduce(_values(rank, dtype))
    expected = _expected_reduction(hvd.Average, size, torch.float64)
    torch.testing.assert_close(result.double(), expected, rtol=1e-2, atol=0)


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
def test_allreduce_in_place_and_async(dtype, rank, size):
    tensor = _values(rank, dtype)
    address = tensor.data_ptr()
    handle = hvd.allreduce_async_(tensor, op=hvd.Sum)
    result = hvd.synchronize(handle)
    assert result is tensor and tensor.data_ptr() == address
    assert torch.equal(tensor, _expected_reduction(hvd.Sum, size, dtype))
    assert hvd.poll(handle)
    assert hvd.synchronize(handle) is None  # as Horovod: already done

    tensor = _values(rank, dtype)
    assert hvd.allreduce_(tensor, op=hvd.Max) is tensor
    assert torch.equal(tensor, _expected_reduction(hvd.Max, size, dtype))

    handle = hvd.allreduce_async(_values(rank, dtype), op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    assert torch.equal(hvd.synchronize(handle),
                       _expected_reduction(hvd.Sum, size, dtype))


def test_allreduce_scale_factors(rank, size):
    tensor = torch.full((4,), float(rank + 1), dtype=torch.float64)
    result = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=2.0,
                           postscale_factor=0.5)
    total = sum(r + 1 for r in range(size))
    torch.testing.assert_close(result, torch.full((4,), float(total),
                                                  dtype=torch.float64))
    result = hvd.allreduce(tensor, op=hvd.Average, postscale_factor=3.0)
    torch.testing.assert_close(result, torch.full((4,), 3.0 * total / size,
                                                  dtype=torch.float64))


def test_allreduce_average_argument_is_deprecated(rank, size):
    with pytest.warns(DeprecationWarning):
        result = hvd.allreduce(torch.ones(2), average=False)
    assert torch.equal(result, torch.full((2,), float(size)))
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_large_outputs_on_the_cores_buffers(dtype, rank, size):
    # From 2 MiB a new output is memory the core's HostBuffer owns (huge
    # pages): it must hold the result, be an ordinary writable tensor and
    # outlive the handle and the input.
    shape = (3, 700_001)
    tensor = _values(rank, dtype, shape)
    before = tensor.clone()
    handle = hvd.allreduce_async(tensor, op=hvd.Sum)
    result = hvd.synchronize(handle)
    del handle, tensor
    assert result.dtype == dtype and result.shape == shape and result.is_contiguous()
    assert torch.equal(result, _expected_reduction(hvd.Sum, size, dtype, shape))
    result += 1
    assert torch.equal(result, _expected_reduction(hvd.Sum, size, dtype, shape) + 1)
    broadcast = hvd.broadcast(before, root_rank=size - 1)
    assert torch.equal(broadcast, _values(size - 1, dtype, shape))


def test_scalar_and_zero_size_tensors(rank, size):
    assert float(hvd.allreduce(torch.tensor(float(rank)), op=hvd.Sum)) == \
        sum(range(size))
    assert hvd.allreduce(torch.zeros(0, 3)).shape == (0, 3)
    gathered = hvd.allgather(torch.tensor(rank))
    assert gathered.tolist() == list(range(size))
    empty = hvd.allgather(torch.zeros(0, 2))
    assert empty.shape == (0, 2)


@pytest.mark.parametrize("in_place", [False, True])
def test_grouped_allreduce(in_place, rank, size):
    tensors = [_values(rank, torch.float32, (3,)),
               _values(rank, torch.int32, (2, 2)),
               _values(rank, torch.float64, (5,))]
    expected = [_expected_reduction(hvd.Sum, size, t.dtype, tuple(t.shape))
                for t in tensors]
    if in_place:
        results = hvd.grouped_allreduce_(tensors, op=hvd.Sum)
        assert all(r is t for r, t in zip(results, tensors))
    else:
        handle = hvd.grouped_allreduce_async(tensors, op=hvd.Sum)
        results = hvd.synchronize(handle)
    for result, want in zip(results, expected):
        assert torch.equal(result, want)
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    assert isinstance(results, list) and len(results) == 3


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_allgather_every_dtype_uneven_rows(dtype, rank, size):
    # Rank r contributes r + 1 rows.
    tensor = _values(rank, dtype, (rank + 1, 2))
    result = hvd.allgather(tensor)
    expected = torch.cat([_values(r, dtype, (r + 1, 2)) for r in range(size)])
    assert result.dtype == dtype and torch.equal(result, expected)
    handle = hvd.allgather_async(tensor)
    assert torch.equal(hvd.synchronize(handle), expected)


def test_grouped_allgather(rank, size):
    tensors = [_values(rank, torch.float32, (rank + 1,)),
               _values(rank, torch.int64, (2, 2))]
    results = hvd.grouped_allgather(tensors)
    assert torch.equal(results[0], torch.cat(
        [_values(r, torch.float32, (r + 1,)) for r in range(size)]))
    assert torch.equal(results[1], torch.cat(
        [_values(r, torch.int64, (2, 2)) for r in range(size)]))


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_broadcast_every_dtype(dtype, rank, size):
    for root in range(size):
        tensor = _values(rank, dtype)
        before = tensor.clone()
        result = hvd.broadcast(tensor, root_rank=root)
        assert torch.equal(result, _values(root, dtype))
        assert torch.equal(tensor, before)
        assert hvd.broadcast_(tensor, root_rank=root) is tensor
        assert torch.equal(tensor, _values(root, dtype))
        handle = hvd.broadcast_async(_values(rank, dtype), root_rank=root)
        assert torch.equal(hvd.synchronize(handle), _values(root, dtype))


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_alltoall_every_dtype(dtype, rank, size):
    # Rank r sends i + 1 rows to rank i, each row holding r.
    splits = [i + 1 for i in range(size)]
    rows = sum(splits)
    tensor = torch.full((rows, 2), rank % 2 if dtype == torch.bool else rank)
    tensor = tensor.to(dtype)
    output, received = hvd.alltoall(tensor, splits=torch.tensor(splits))
    assert received.dtype == torch.int32
    assert received.tolist() == [rank + 1] * size
    expected = torch.cat([
        torch.full((rank + 1, 2), r % 2 if dtype == torch.bool else r)
        for r in range(size)]).to(dtype)
    assert torch.equal(output, expected)


def test_alltoall_returns_splits_only_when_given(rank, size):
    # As in Horovod: the tensor alone without splits, (tensor, received
    # splits) with them.
    tensor = torch.arange(size, dtype=torch.float32) + 10 * rank
    output = hvd.alltoall(tensor)
    assert isinstance(output, torch.Tensor)
    assert output.tolist() == [float(rank + 10 * r) for r in range(size)]
    output, received = hvd.alltoall(tensor, splits=[1] * size)
    assert received.tolist() == [1] * size and received.dtype == torch.int32


def test_alltoall_even_split_and_async(rank, size):
    tensor = torch.arange(size * 2, dtype=torch.float32) + 100 * rank
    handle = hvd.alltoall_async(tensor)
    output, received = hvd.synchronize(handle)
    assert received.tolist() == [2] * size
    expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2,
                                       dtype=torch.float32) + 100 * r
                          for r in range(size)])
    assert torch.equal(output, expected)


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
def test_reducescatter_every_dtype(dtype, rank, size):
    tensor = _values(rank, dtype, (size * 2, 3))
    result = hvd.reducescatter(tensor, op=hvd.Sum)
    total = _expected_reduction(hvd.Sum, size, dtype, (size * 2, 3))
    assert torch.equal(result, total[2 * rank:2 * rank + 2])
    handle = hvd.reducescatter_async(tensor, op=hvd.Sum)
    assert torch.equal(hvd.synchronize(handle), total[2 * rank:2 * rank + 2])


def test_reducescatter_average_and_grouped(rank, size):
    tensors = [torch.full((size, 2), float(rank)),
               torch.full((2 * size,), float(rank), dtype=torch.float64)]
    mean = sum(range(size)) / size
    results = hvd.grouped_reducescatter(tensors)
    torch.testing.assert_close(results[0], torch.full((1, 2), mean))
    torch.testing.assert_close(results[1], torch.full((2,), mean,
                                                      dtype=torch.float64))
    handle = hvd.grouped_reducescatter_async(tensors, op=hvd.Sum)
    sums = hvd.synchronize(handle)
    torch.testing.assert_close(sums[0], torch.full((1, 2), mean * size))


def test_named_collectives_in_any_order(rank, size):
    # Ranks submit the same named tensors in different orders.
    names = ["a", "b", "c", "d"]
    order = names if rank % 2 == 0 else list(reversed(names))
    handles = {n: hvd.allreduce_async(torch.full((3,), float(i)), name=n,
                                      op=hvd.Sum)
               for n, i in zip(order, range(4))}
    for n in names:
        value = names.index(n) if rank % 2 == 0 else 3 - names.index(n)
        result = hvd.synchronize(handles[n])
        expected = sum(names.index(n) if r % 2 == 0 else 3 - names.index(n)
                       for r in range(size))
        assert torch.equal(result, torch.full((3,), float(expected)))
        del value


def test_large_tensor_crosses_fusion(rank, size):
    tensor = torch.full((3 * 1024 * 1024,), float(rank + 1))
    result = hvd.allreduce(tensor, op=hvd.Sum)
    assert float(result[0]) == float(result[-1]) == sum(
        r + 1 for r in range(size))


def test_fp16_compression(rank, size):
    tensor = torch.full((5,), 0.5 * (rank + 1), dtype=torch.float32)
    result = hvd.allreduce(tensor, op=hvd.Sum,
                           compression=hvd.Compression.fp16)
    assert result.dtype == torch.float32
    torch.testing.assert_close(result, torch.full(
        (5,), 0.5 * sum(r + 1 for r in range(size))))
    # bfloat16 is sent as it is (float16 would narrow its range).
    compressed, ctx = hvd.Compression.fp16.compress(
        torch.full((2,), 1e30, dtype=torch.bfloat16))
    assert compressed.dtype == torch.bfloat16
    assert hvd.Compression.fp16.compress(torch.ones(1))[0].dtype == \
        torch.float16


def test_topology(rank, size):
    assert hvd.is_initialized()
    assert 0 <= hvd.local_rank() < hvd.local_size() <= size
    assert hvd.cross_size() >= 1 and 0 <= hvd.cross_rank()
    assert hvd.mpi_built() and hvd.mpi_enabled()
    assert not hvd.gloo_built() and not hvd.cuda_built()
    assert hvd.nccl_built() == 0
    assert hvd.allgather(torch.tensor([hvd.rank()])).tolist() == \
        list(range(size))


def test_barrier(rank, size):
    for _ in range(3):
        hvd.barrier()
