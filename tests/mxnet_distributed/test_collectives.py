"""Every tfring.mxnet collective, dtype and form (in place and not) at any
number of ranks: results are checked against what each rank can compute
from every rank's (deterministic) inputs."""

import mxnet as mx
import numpy as np
import pytest

import tfring.mxnet as hvd

REDUCIBLE = ["uint8", "int8", "int32", "int64", "float16", "float32", "float64"]
MOVABLE = REDUCIBLE + ["bool"]


def values(rank, shape, dtype):
    """Rank `rank`'s input: small values every dtype holds exactly."""
    if dtype == "bool":
        return (np.arange(np.prod(shape)).reshape(shape) + rank) % 2 == 0
    return ((np.arange(np.prod(shape)).reshape(shape) % 5) + rank + 1).astype(dtype)


def nd(array):
    return mx.nd.array(array, dtype=array.dtype)


@pytest.mark.parametrize("dtype", REDUCIBLE)
def test_allreduce_sum_every_dtype(dtype, size, rank):
    inputs = [values(r, (3, 4), dtype) for r in range(size)]
    expected = np.sum(inputs, axis=0).astype(dtype)
    tensor = nd(inputs[rank])
    result = hvd.allreduce(tensor, op=hvd.Sum, name=f"sum.{dtype}")
    assert result.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(result.asnumpy(), expected)
    np.testing.assert_array_equal(tensor.asnumpy(), inputs[rank])  # not modified


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_allreduce_average_in_place(dtype, size, rank):
    inputs = [values(r, (5,), dtype) for r in range(size)]
    tensor = nd(inputs[rank])
    same = hvd.allreduce_(tensor)
    assert same is tensor
    np.testing.assert_allclose(tensor.asnumpy(), np.mean(inputs, axis=0), rtol=1e-3)


@pytest.mark.parametrize("op,reduce", [(hvd.Min, np.min), (hvd.Max, np.max),
                                       (hvd.Product, np.prod)])
def test_allreduce_min_max_product(op, reduce, size, rank):
    inputs = [values(r, (6,), "float32") for r in range(size)]
    result = hvd.allreduce(nd(inputs[rank]), op=op)
    np.testing.assert_allclose(result.asnumpy(), reduce(inputs, axis=0))


def test_allreduce_scale_factors_and_average_flag(size, rank):
    x = nd(np.full((4,), rank + 1.0, dtype=np.float32))
    total = sum(r + 1.0 for r in range(size))
    result = hvd.allreduce(x, average=False, prescale_factor=2.0, postscale_factor=0.5)
    np.testing.assert_allclose(result.asnumpy(), total)


def test_allreduce_follows_pending_mxnet_work(size, rank):
    """The core reads an input only after MXNet has finished computing it,
    and MXNet reads the output only after the core wrote it."""
    a = mx.nd.ones((256, 256)) * (rank + 1)
    b = mx.nd.dot(a, mx.nd.ones((256, 256)))  # pending in MXNet's engine
    result = hvd.allreduce(b, op=hvd.Sum)
    c = result * 2  # MXNet reads the output at once
    expected = 256.0 * sum(r + 1 for r in range(size)) * 2
    np.testing.assert_allclose(c.asnumpy(), expected)


def test_grouped_allreduce_both_forms(size, rank):
    inputs = [[values(r, (i + 1, 3), "float32") for i in range(3)] for r in range(size)]
    tensors = [nd(t) for t in inputs[rank]]
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for i, result in enumerate(results):
        np.testing.assert_allclose(result.asnumpy(), sum(inputs[r][i] for r in range(size)))
    hvd.grouped_allreduce_(tensors, name="grouped.inplace")
    for i, tensor in enumerate(tensors):
        np.testing.assert_allclose(tensor.asnumpy(),
                                   np.mean([inputs[r][i] for r in range(size)], axis=0))


@pytest.mark.parametrize("dtype", MOVABLE)
def test_allgather_every_dtype_uneven_rows(dtype, size, rank):
    inputs = [values(r, (r + 1, 2), dtype) for r in range(size)]
    result = hvd.allgather(nd(inputs[rank]), name=f"gather.{dtype}")
    assert result.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(result.asnumpy(), np.concatenate(inputs))


def test_grouped_allgather(size, rank):
    inputs = [[values(r, (r + 1, i + 1), "int32") for i in range(2)] for r in range(size)]
    results = hvd.grouped_allgather([nd(t) for t in inputs[rank]])
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.asnumpy(),
                                      np.concatenate([inputs[r][i] for r in range(size)]))


@pytest.mark.parametrize("dtype", MOVABLE)
def test_broadcast_both_forms_every_dtype(dtype, size, rank):
    root = size - 1
    inputs = [values(r, (2, 3), dtype) for r in range(size)]
    tensor = nd(inputs[rank])
    result = hvd.broadcast(tensor, root_rank=root, name=f"bcast.{dtype}")
    np.testing.assert_array_equal(result.asnumpy(), inputs[root])
    np.testing.assert_array_equal(tensor.asnumpy(), inputs[rank])
    same = hvd.broadcast_(tensor, root_rank=root, name=f"bcast_.{dtype}")
    assert same is tensor
    np.testing.assert_array_equal(tensor.asnumpy(), inputs[root])


def test_alltoall_with_and_without_splits(size, rank):
    rows = np.arange(size * 2, dtype=np.float32).reshape(size * 2, 1) + 100 * rank
    result = hvd.alltoall(nd(rows))
    expected = np.concatenate([(np.arange(size * 2, dtype=np.float32).reshape(-1, 1)
                                + 100 * r)[2 * rank:2 * rank + 2] for r in range(size)])
    np.testing.assert_array_equal(result.asnumpy(), expected)
    # Rank r sends r + 1 rows to every rank.
    splits = [rank + 1] * size
    data = nd(np.full((sum(splits), 2), rank, dtype=np.int32))
    output, received = hvd.alltoall(data, splits=splits)
    np.testing.assert_array_equal(received.asnumpy(), [r + 1 for r in range(size)])
    np.testing.assert_array_equal(
        output.asnumpy(),
        np.concatenate([np.full((r + 1, 2), r, dtype=np.int32) for r in range(size)]))


def test_reducescatter_and_grouped(size, rank):
    inputs = [values(r, (size * 2, 3), "float32") for r in range(size)]
    total = np.sum(inputs, axis=0)
    result = hvd.reducescatter(nd(inputs[rank]), op=hvd.Sum)
    np.testing.assert_allclose(result.asnumpy(), total[2 * rank:2 * rank + 2])
    results = hvd.grouped_reducescatter([nd(inputs[rank]), nd(inputs[rank] * 2)])
    np.testing.assert_allclose(results[0].asnumpy(), total[2 * rank:2 * rank + 2] / size)
    np.testing.assert_allclose(results[1].asnumpy(), 2 * total[2 * rank:2 * rank + 2] / size)


def test_objects(size, rank):
    got = hvd.broadcast_object({"epoch": 7, "rank": rank} if rank == 0 else None, root_rank=0)
    assert got == {"epoch": 7, "rank": 0}
    assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]


def test_broadcast_parameters_dict_and_gluon(size, rank):
    arrays = {"w": mx.nd.ones((3,)) * rank, "b": mx.nd.ones((2, 2)) * (rank + 5)}
    hvd.broadcast_parameters(arrays, root_rank=0, prefix="dict.")
    np.testing.assert_array_equal(arrays["w"].asnumpy(), 0)
    np.testing.assert_array_equal(arrays["b"].asnumpy(), 5)

    mx.random.seed(rank)
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize(mx.init.Uniform())
    hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix="dense.")
    gathered = hvd.allgather(net.weight.data().expand_dims(0))
    for r in range(size):
        np.testing.assert_array_equal(gathered[r].asnumpy(), gathered[0].asnumpy())

    # Deferred initialization: broadcast right after MXNet initializes it.
    mx.random.seed(rank + 10)
    late = mx.gluon.nn.Dense(2)
    late.initialize(mx.init.Uniform())
    hvd.broadcast_parameters(late.collect_params(), root_rank=0, prefix="late.")
    late(mx.nd.ones((1, 3)))
    gathered = hvd.allgather(late.weight.data().expand_dims(0))
    for r in range(size):
        np.testing.assert_array_equal(gathered[r].asnumpy(), gathered[0].asnumpy())


def test_process_set_and_join(size, rank):
    if size < 2:
        pytest.skip("a process set other than the job's needs two ranks")
    others = hvd.add_process_set(list(range(1, size)))
    try:
        if others.included():
            result = hvd.allreduce(mx.nd.ones((2,)) * rank, op=hvd.Sum, process_set=others)
            np.testing.assert_array_equal(result.asnumpy(), sum(range(1, size)))
        else:
            with pytest.raises(ValueError, match="does not contain rank 0"):
                hvd.allreduce(mx.nd.ones((2,)), process_set=others)
    finally:
        hvd.remove_process_set(others)
    assert hvd.join() in range(size)


def test_compression_fp16_roundtrip():
    x = mx.nd.array([1.5, -2.25], dtype="float32")
    sent, ctx = hvd.Compression.fp16.compress(x)
    assert sent.dtype == np.float16
    back = hvd.Compression.fp16.decompress(sent, ctx)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back.asnumpy(), x.asnumpy())
