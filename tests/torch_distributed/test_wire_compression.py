# Wire compression from tfring.torch (Compression.bf16_wire / fp16_wire) on
# one host: the core encodes only what crosses hosts, so every result equals
# the uncompressed one bit for bit, through the collectives (plain, in place,
# grouped, autograd) and DistributedOptimizer (one tensor at a time and
# grouped); float64 and integer tensors are untouched; Compression.fp16 stays
# Horovod's cast.

import copy

import pytest
import torch

import tfring.torch as hvd

WIRE = [hvd.Compression.bf16_wire, hvd.Compression.fp16_wire]


def _values(shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed + 31 * hvd.rank())
    scale = 10.0 ** torch.randint(-6, 6, shape, generator=generator)
    return (torch.randn(shape, generator=generator) * scale).to(dtype)


@pytest.mark.parametrize("compression", WIRE, ids=lambda c: c.wire)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_collectives_equal_uncompressed_on_one_host(compression, op):
    for shape in [(), (7,), (300, 5), (70000,)]:
        x = _values(shape)
        plain = hvd.allreduce(x, op=op, name=f"t.plain.{shape}.{op}")
        wired = hvd.allreduce(x, op=op, compression=compression,
                              name=f"t.wire.{shape}.{op}")
        assert torch.equal(wired, plain)
        in_place = x.clone()
        hvd.synchronize(hvd.allreduce_async_(in_place, op=op, compression=compression))
        assert torch.equal(in_place, plain)
    tensors = [_values((5, 3), seed=1), _values((4,), torch.float64, seed=2),
               torch.arange(6, dtype=torch.int32) * (hvd.rank() + 1)]
    plain = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    wired = hvd.grouped_allreduce(tensors, op=hvd.Sum, compression=compression)
    for p, w in zip(plain, wired):
        assert p.dtype == w.dtype and torch.equal(w, p)


@pytest.mark.parametrize("compression", WIRE, ids=lambda c: c.wire)
def test_autograd_allreduce_with_wire_compression(compression):
    x = _values((6,), seed=3).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum, compression=compression)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((6,), float(hvd.size())))


@pytest.mark.parametrize("groups", [None, 2])
@pytest.mark.parametrize("compression", WIRE, ids=lambda c: c.wire)
def test_optimizer_with_wire_compression(compression, groups):
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    twin = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(5 + hvd.rank())
    x = torch.randn(16, 4, generator=generator)
    y = torch.randn(16, 3, generator=generator)

    def train(model, compression):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(),
                                       compression=compression, groups=groups)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    train(model, compression)
    train(twin, hvd.Compression.none)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_fp16_keeps_horovods_meaning():
    x = torch.full((3,), 1.0 + 2.0 ** -12)
    out = hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32 and torch.equal(out, torch.ones(3))
