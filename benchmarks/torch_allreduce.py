"""tfring.torch against torch.distributed (gloo) and raw MPI, in one job.

    tfringrun -np 2 python benchmarks/torch_allreduce.py [--repeats 20]
        [--steps 30] [--cases allreduce,resnet50,training]

Why one job: the machine is noisy, so every baseline runs in the same
processes as tfring, interleaved repetition by repetition, and the tables
give ratios. Each rank starts torch.distributed with gloo next to tfring
(rank 0's address and a free port reach the others through mpi4py).

allreduce
  one float32 tensor of 4 KiB, 256 KiB, 4 MiB and 64 MiB, summed:
  gloo all_reduce in place (its best way), mpi4py Allreduce in place,
  tfring.torch allreduce_ (in place) and allreduce (a new output).
resnet50
  the gradient set of torchvision's ResNet-50 (161 tensors, 25.6 M
  floats; the shapes are built here): gloo one all_reduce per tensor; gloo
  in DDP's 25 MiB buckets (each bucket packed into one flat buffer, reduced
  in place, unpacked: what DistributedDataParallel does); mpi4py one
  Allreduce per tensor in place; tfring.torch grouped_allreduce_ and one
  allreduce_async_ per tensor, then synchronize.
training
  a training step (forward, backward, SGD step; batch 32 per rank of
  random 28x28 / 32x32 images) of a small CNN and of a small ResNet:
  tfring.torch.DistributedOptimizer against DistributedDataParallel (gloo)
  and against the ceiling, the same step with no communication run on
  every rank at once. Throughput is images per second over all ranks.

Results are checked (sums exact on small integers) before timing.
"""

import argparse
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI
import torch
import torch.distributed as dist
import torch.nn as nn

import tfring.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import check, describe_size, measure, private_array  # noqa: E402

SIZES = [4 * 1024, 256 * 1024, 4 * 1024 * 1024, 64 * 1024 * 1024]
DDP_BUCKET_BYTES = 25 * 1024 * 1024
BATCH = 32


def start_gloo(comm):
    """torch.distributed (gloo) over the same ranks as MPI_COMM_WORLD."""
    address = None
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            address = ("127.0.0.1", probe.getsockname()[1])
    host, port = comm.bcast(address, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())


def resnet50_gradient_shapes():
    """The parameter shapes of torchvision's resnet50() (weights and
    batch-norm scales and shifts, the classifier last)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out = width * 4
            shapes += [(width, in_channels, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out, width, 1, 1), (out,), (out,)]
            if block == 0:
                shapes += [(out, in_channels, 1, 1), (out,), (out,)]
            in_channels = out
    return shapes + [(1000, 2048), (1000,)]


def small_integers(shape, rank):
    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(0, 64, shape, generator=generator).to(torch.float32)


def allreduce_cases(comm, repeats):
    rank, size = comm.Get_rank(), comm.Get_size()
    results = []
    for num_bytes in SIZES:
        count = num_bytes // 4
        mine = small_integers((count,), rank)
        expected = sum(small_integers((count,), r) for r in range(size)).numpy()
        torch_buffer = mine.clone()
        mpi_buffer = private_array((count,))
        variants = {
            "mpi4py Allreduce in place": lambda: comm.Allreduce(MPI.IN_PLACE, mpi_buffer),
            "gloo all_reduce in place": lambda: dist.all_reduce(torch_buffer),
            "tfring.torch allreduce_ (in place)":
                lambda: hvd.allreduce_(torch_buffer, op=hvd.Sum, name=f"inplace{count}"),
            "tfring.torch allreduce (new output)":
                lambda: hvd.allreduce(mine, op=hvd.Sum, name=f"out{count}"),
        }
        torch_buffer.copy_(mine)
        dist.all_reduce(torch_buffer)
        check("gloo all_reduce", torch_buffer.numpy(), expected)
        torch_buffer.copy_(mine)
        hvd.allreduce_(torch_buffer, op=hvd.Sum, name=f"inplace{count}")
        check("tfring.torch allreduce_", torch_buffer.numpy(), expected)
        check("tfring.torch allreduce",
              hvd.allreduce(mine, op=hvd.Sum, name=f"out{count}").numpy(), expected)
        results.append((describe_size(num_bytes), measure(comm, variants, repeats)))
    return results


def _buckets(tensors, bucket_bytes):
    """DDP's grouping: consecutive tensors up to bucket_bytes each."""
    buckets, current, current_bytes = [], [], 0
    for tensor in tensors:
        if current and current_bytes + tensor.numel() * 4 > bucket_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(tensor)
        current_bytes += tensor.numel() * 4
    return buckets + ([current] if current else [])


def resnet50_case(comm, repeats):
    rank, size = comm.Get_rank(), comm.Get_size()
    shapes = resnet50_gradient_shapes()
    grads = [small_integers(s, rank) for s in shapes]
    expected = [sum(small_integers(s, r) for r in range(size)) for s in shapes]
    work = [g.clone() for g in grads]
    buckets = _buckets(work, DDP_BUCKET_BYTES)
    flats = [torch.empty(sum(t.numel() for t in b)) for b in buckets]
    mpi_work = [private_array(tuple(s)) for s in shapes]

    def gloo_per_tensor():
        for tensor in work:
            dist.all_reduce(tensor)

    def gloo_buckets():
        for bucket, flat in zip(buckets, flats):
            torch.cat([t.view(-1) for t in bucket], out=flat)
            dist.all_reduce(flat)
            offset = 0
            for tensor in bucket:
                tensor.view(-1).copy_(flat[offset:offset + tensor.numel()])
                offset += tensor.numel()

    def mpi_per_tensor():
        for array in mpi_work:
            comm.Allreduce(MPI.IN_PLACE, array)

    def tfring_grouped():
        hvd.grouped_allreduce_(work, op=hvd.Sum, name="resnet50_grouped")

    def tfring_async():
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"resnet50.{i}")
                   for i, t in enumerate(work)]
        for handle in handles:
            hvd.synchronize(handle)

    for label, run in (("gloo per tensor", gloo_per_tensor), ("gloo buckets", gloo_buckets),
                       ("tfring grouped", tfring_grouped), ("tfring async", tfring_async)):
        for tensor, grad in zip(work, grads):
            tensor.copy_(grad)
        run()
        for tensor, want in zip(work, expected):
            check(f"ResNet-50 set, {label}", tensor.numpy(), want.numpy())
    variants = {
        "mpi4py one Allreduce per tensor in place": mpi_per_tensor,
        "gloo one all_reduce per tensor in place": gloo_per_tensor,
        "gloo in DDP's 25 MiB buckets (pack, in place, unpack)": gloo_buckets,
        "tfring.torch grouped_allreduce_": tfring_grouped,
        "tfring.torch allreduce_async_ per tensor, synchronize": tfring_async,
    }
    return [(f"ResNet-50 set ({len(shapes)} tensors)", measure(comm, variants, repeats))]


class SmallCNN(nn.Module):
    """Two convolutions and two dense layers on 28x28 images (MNIST-sized)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(64 * 12 * 12, 128), nn.ReLU(),
                                        nn.Linear(128, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
            nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels))

    def forward(self, x):
        return torch.relu(x + self.body(x))


class SmallResNet(nn.Module):
    """A ResNet of four residual blocks on 32x32 images (CIFAR-sized)."""

    def __init__(self, width=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            ResidualBlock(width), ResidualBlock(width), nn.MaxPool2d(2),
            ResidualBlock(width), ResidualBlock(width),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))

    def forward(self, x):
        return self.net(x)


def training_case(comm, model_class, image_shape, steps):
    """Images per second over all ranks, per variant, alternating runs of
    `steps` steps (the first run of each is a warm-up)."""
    size = comm.Get_size()
    torch.manual_seed(0)
    images = torch.randn(BATCH, *image_shape)
    labels = torch.randint(0, 10, (BATCH,))
    loss_fn = nn.CrossEntropyLoss()

    def make_step(model, optimizer):
        def step():
            optimizer.zero_grad()
            loss_fn(model(images), labels).backward()
            optimizer.step()
        return step

    ceiling_model = model_class()
    ceiling = make_step(ceiling_model, torch.optim.SGD(ceiling_model.parameters(), lr=0.01))
    ddp_model = nn.parallel.DistributedDataParallel(model_class())
    ddp = make_step(ddp_model, torch.optim.SGD(ddp_model.parameters(), lr=0.01))
    tfring_model = model_class()
    tfring_optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(tfring_model.parameters(), lr=0.01),
        named_parameters=tfring_model.named_parameters())
    tfring_step = make_step(tfring_model, tfring_optimizer)
    variants = {"no communication (ceiling)": ceiling, "DDP (gloo)": ddp,
                "tfring.torch DistributedOptimizer": tfring_step}
    rates = {label: [] for label in variants}
    for round_index in range(4):
        for label, step in variants.items():
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if round_index > 0:
                rates[label].append(BATCH * size * steps / elapsed)
    return rates


def print_training(name, rates):
    ceiling = np.median(rates["no communication (ceiling)"])
    ddp = np.median(rates["DDP (gloo)"])
    print(f"\n{name}, batch {BATCH} per rank")
    print(f"{'variant':<36} {'img/s':>8} {'/ceiling':>9} {'/DDP':>6}")
    for label, values in rates.items():
        median = np.median(values)
        print(f"{label:<36} {median:8.0f} {median / ceiling:9.2f} {median / ddp:6.2f}")


def print_ratios(results):
    """Per case: median ms of each variant and its ratio to gloo's best and
    to MPI's."""
    print(f"{'case':<28} {'variant':<56} {'median ms':>9} {'/gloo':>6} {'/MPI':>6}")
    for case, times in results:
        gloo = min(np.median(v) for k, v in times.items() if k.startswith("gloo"))
        mpi = min(np.median(v) for k, v in times.items() if k.startswith("mpi4py"))
        for label, values in times.items():
            median = np.median(values)
            print(f"{case:<28} {label:<56} {median * 1e3:9.3f} "
                  f"{median / gloo:6.2f} {median / mpi:6.2f}")
        print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30,
                        help="training steps per timed run")
    parser.add_argument("--cases", default="allreduce,resnet50,training")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    torch.set_num_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    start_gloo(comm)
    results = []
    if "allreduce" in cases:
        results += allreduce_cases(comm, args.repeats)
    if "resnet50" in cases:
        results += resnet50_case(comm, max(3, args.repeats // 4))
    training = []
    if "training" in cases:
        training.append(("small CNN (28x28)", training_case(comm, SmallCNN, (1, 28, 28),
                                                            args.steps)))
        training.append(("small ResNet (32x32)", training_case(comm, SmallResNet, (3, 32, 32),
                                                               max(5, args.steps // 3))))
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} ranks, torch {torch.__version__}, one intra-op thread "
              f"per rank, {time.strftime('%Y-%m-%d')}")
        if results:
            print_ratios(results)
        for name, rates in training:
            print_training(name, rates)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
