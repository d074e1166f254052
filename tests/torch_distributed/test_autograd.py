# Gradients through tfring.torch's collectives, as horovod.torch defines
# them (see tfring/torch/autograd_functions.py), at any number of ranks.

import pytest
import torch

import tfring.torch as hvd


@pytest.mark.parametrize("op,expected", [("Sum", "size"), ("Average", 1.0)])
def test_allreduce_gradient(op, expected, rank, size):
    x = torch.full((3,), float(rank), dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(x, op=getattr(hvd, op))
    (y * 2.0).sum().backward()
    want = 2.0 * (size if expected == "size" else expected)
    assert torch.allclose(x.grad, torch.full((3,), want, dtype=torch.float64))


def test_grouped_allreduce_gradient(rank, size):
    xs = [torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    (ys[0].sum() + 3.0 * ys[1].sum()).backward()
    assert torch.allclose(xs[0].grad, torch.full((2,), float(size)))
    assert torch.allclose(xs[1].grad, torch.full((3,), 3.0 * size))


def test_allgather_gradient(rank, size):
    # Rank r holds r + 1 rows; the loss weighs row i of the result by i.
    x = torch.ones(rank + 1, 2, dtype=torch.float64, requires_grad=True)
    y = hvd.allgather(x)
    weights = torch.arange(y.shape[0], dtype=torch.float64).unsqueeze(1)
    (y * weights).sum().backward()
    first = sum(r + 1 for r in range(rank))
    want = torch.arange(first, first + rank + 1,
                        dtype=torch.float64).unsqueeze(1).expand(-1, 2)
    assert torch.allclose(x.grad, want)


def test_grouped_allgather_gradient(rank, size):
    xs = [torch.ones(rank + 1, requires_grad=True),
          torch.ones(2, 2, requires_grad=True)]
    ys = hvd.grouped_allgather(xs)
    (ys[0].sum() + 2.0 * ys[1].sum()).backward()
    assert torch.allclose(xs[0].grad, torch.ones(rank + 1))
    assert torch.allclose(xs[1].grad, torch.full((2, 2), 2.0))


def test_broadcast_gradient(rank, size):
    root = size - 1
    x = torch.ones(3, requires_grad=True)
    hvd.broadcast(x, root_rank=root).sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 1.0 if rank == root
                                             else 0.0))


def test_alltoall_gradient(rank, size):
    splits = [1 + (i % 2) for i in range(size)]
    x = torch.ones(sum(splits), 2, requires_grad=True)
    output, received = hvd.alltoall(x, splits=splits)
    assert not received.requires_grad
    weights = torch.arange(output.shape[0], dtype=torch.float32)
    (output * weights.unsqueeze(1)).sum().backward()
    # Every rank sends rank i splits[i] rows, which rank i receives in rank
    # order: ours at rows [rank * splits[i], (rank + 1) * splits[i]), whose
    # weights come back as our gradient.
    want = torch.cat([torch.arange(rank * splits[i], (rank + 1) * splits[i],
                                   dtype=torch.float32) for i in range(size)])
    assert torch.allclose(x.grad, want.unsqueeze(1).expand(-1, 2))


@pytest.mark.parametrize("op,factor", [("Sum", "size"), ("Average", 1.0)])
def test_reducescatter_gradient(op, factor, rank, size):
    x = torch.ones(size * 2, 3, dtype=torch.float64, requires_grad=True)
    y = hvd.reducescatter(x, op=getattr(hvd, op))
    (y * float(rank + 1)).sum().backward()
    scale = size if factor == "size" else factor
    want = torch.cat([torch.full((2, 3), float(r + 1) * scale,
                                 dtype=torch.float64) for r in range(size)])
    assert torch.allclose(x.grad, want)


def test_grouped_reducescatter_gradient(rank, size):
    xs = [torch.ones(size, requires_grad=True),
          torch.ones(size * 2, requires_grad=True)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    (ys[0].sum() + ys[1].sum()).backward()
    assert torch.allclose(xs[0].grad, torch.full((size,), float(size)))
    assert torch.allclose(xs[1].grad, torch.full((size * 2,), float(size)))
