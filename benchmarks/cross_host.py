"""Gradient compression across hosts: fp32, bf16/fp16 wire and PowerSGD
against the link limit, raw MPI and torch DDP (gloo) with its PowerSGD hook.

    python benchmarks/cross_host.py                        # 2 hosts x 2 ranks, 1 Gbit/s, ResNet-50 set
    python benchmarks/cross_host.py --set small --repeats 2   # a quick check
    python benchmarks/cross_host.py --hosts 4 --ranks-per-host 1 --link-rate 10gbit
    python benchmarks/cross_host.py --paths flat --wire fp32 --no-raw-mpi --powersgd-ranks 4
                                                           # fp32 flat and PowerSGD r=4 only

This machine plays the hosts (benchmarks/_namespace_hosts.py: network
namespaces with token-bucket links, so the network between hosts is the
bottleneck and the ranks of a host share memory). Needs root.

Two jobs run on the same hosts, one after the other:
  * tfring (TensorFlow): the gradient set (ResNet-50's 161 trainable tensors,
    25.6 M float32 values, or --set small) reduced (Average) by one
    grouped_allreduce in a tf.function with Compression.none, bf16_wire and
    fp16_wire, first on the flat path (TFRING_HIERARCHICAL_ALLREDUCE=0: wire
    compression then encodes every rank's data), then on the hierarchical
    path (=1: float32 inside each host, only the cross-host slices encoded),
    and with --paths default, with the variable unset (the core's choice);
    PowerSGD (tfring.PowerSGD, ranks 1, 4, 16, compressing from the first
    step) on the flat path; and raw MPI: one mpi4py Allreduce of the whole
    set as one float32 buffer. Results are checked once before timing
    (fp32 exactly; bf16/fp16 within their bounds). --paths, --wire and
    --no-raw-mpi leave variants out.
  * PowerSGD's compute alone: one process (tfring at 1 rank, so the
    allreduces move nothing) times the same PowerSGD step on one core,
    printed next to the table: the part of a PowerSGD row that is
    arithmetic, not network (the ranks of a host share its cores, so each
    pays more than this). --no-compute-alone leaves it out.
  * with --with-ddp: torch DDP with gloo on the same gradient set (as
    parameters in torch's layout), plain and with DDP's powerSGD_hook
    (rank 4; the whole set in one DDP bucket, because the hook blocks a gloo
    worker thread per bucket and two buckets stalled DDP): the time of
    backward(), which returns when DDP's allreduces are done. Off by
    default (it adds a few minutes).
Times are the slowest rank's per repetition; medians and minimums, and the
speed-up over the link limit: the time a host's link needs to move its share
of a float32 ring allreduce of the set, 2 (H - 1) / H x S bytes at the link
rate. If a job does not finish within --timeout, the benchmark prints where
each rank was.
"""

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _namespace_hosts  # noqa: E402

DDP_POWERSGD_RANK = 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _namespace_hosts.add_arguments(parser)
    parser.add_argument("--worker-ddp", action="store_true",
                        help="(internal) the torch DDP worker")
    parser.add_argument("--set", choices=("resnet50", "small"), default="resnet50",
                        help="gradient set: ResNet-50's (default) or a small one")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed repetitions per variant (default 5)")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds before a job is ended (default 900)")
    parser.add_argument("--powersgd-ranks", default="1,4,16",
                        help="PowerSGD ranks to time, comma-separated (default 1,4,16)")
    parser.add_argument("--paths", default="flat,hierarchical",
                        help="tfring paths to time, comma-separated: flat, hierarchical, and "
                             "default (TFRING_HIERARCHICAL_ALLREDUCE unset) (default "
                             "flat,hierarchical)")
    parser.add_argument("--wire", default="fp32,bf16,fp16",
                        help="grouped_allreduce compressions to time on each path, "
                             "comma-separated (default fp32,bf16,fp16)")
    parser.add_argument("--raw-mpi", action=argparse.BooleanOptionalAction, default=True,
                        help="time the raw MPI Allreduce (default yes)")
    parser.add_argument("--compute-alone", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="time PowerSGD's compute alone, at 1 rank (default yes)")
    parser.add_argument("--worker-compute", action="store_true",
                        help="(internal) the 1-rank PowerSGD compute worker")
    parser.add_argument("--with-ddp", action="store_true",
                        help="also run the torch DDP (gloo) job (a few minutes more)")
    parser.add_argument("--only", choices=("tfring", "ddp"),
                        help="run only the tfring or the torch DDP job")
    parser.add_argument("--shapes-file", help="(worker) the gradient set's shapes")
    parser.add_argument("--progress-dir", help="(worker) where ranks record their step")
    parser.add_argument("--results-file", help="(worker) where rank 0 writes its times")
    parser.add_argument("--master-addr", help="(DDP worker) rank 0's address")
    return parser.parse_args(argv)


def gradient_shapes(which):
    """The gradient set, in Keras' layout (outputs last)."""
    if which == "small":
        return [(256, 256)] * 6 + [(3, 3, 32, 64)] * 4 + [(256,)] * 6
    sys.path.insert(0, HERE)
    from allreduce import resnet50_shapes
    return resnet50_shapes()


def _progress(args, rank, text):
    if args.progress_dir:
        with open(os.path.join(args.progress_dir, f"rank{rank}"), "w") as f:
            f.write(text)


def _rank_values(rank, shape):
    """Rank `rank`'s gradient: float32 values of mixed magnitudes."""
    import numpy as np
    rng = np.random.default_rng(1000 + rank)
    return (rng.standard_normal(shape) * 1e-3).astype(np.float32)


# ----------------------------------------------------------- tfring worker --

def tfring_worker(args):
    import numpy as np
    from mpi4py import MPI
    import tensorflow as tf
    import tfring as hvd
    from _timing import measure

    tf.config.threading.set_intra_op_parallelism_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    with open(args.shapes_file) as f:
        shapes = [tuple(s) for s in json.load(f)]
    inputs = [tf.constant(_rank_values(rank, s)) for s in shapes]
    exact = [np.mean([_rank_values(r, s).astype(np.float64) for r in range(size)], axis=0)
             for s in shapes]
    magnitude = [np.mean([np.abs(_rank_values(r, s).astype(np.float64))
                          for r in range(size)], axis=0) for s in shapes]
    flat_buffer = np.concatenate([_rank_values(rank, s).ravel() for s in shapes])
    keys = [f"g{i}" for i in range(len(shapes))]
    compressions = {"fp32": hvd.Compression.none, "bf16 wire": hvd.Compression.bf16_wire,
                    "fp16 wire": hvd.Compression.fp16_wire}
    labels = {"fp32": "fp32", "bf16": "bf16 wire", "fp16": "fp16 wire"}
    wanted = {labels[w] for w in args.wire.split(",") if w in labels}
    compressions = {k: v for k, v in compressions.items() if k in wanted}
    paths = [p for p in (("default", None), ("flat", "0"), ("hierarchical", "1"))
             if p[0] in args.paths.split(",")]
    bounds = {"fp32": 2.0 ** -20, "bf16 wire": 2.0 ** -7, "fp16 wire": 2.0 ** -9}
    times = {}
    for path, setting in paths:
        if setting is None:  # the core's default
            os.environ.pop("TFRING_HIERARCHICAL_ALLREDUCE", None)
        else:
            os.environ["TFRING_HIERARCHICAL_ALLREDUCE"] = setting
        _progress(args, rank, f"{path}: tfring.init()")
        hvd.init()
        variants = {}
        for label, compression in compressions.items():
            fn = tf.function(lambda ts, c=compression: hvd.grouped_allreduce(
                ts, op=hvd.Average, compression=c))
            _progress(args, rank, f"{path}: checking {label}")
            for got, want, scale in zip(fn(inputs), exact, magnitude):
                error = np.abs(got.numpy().astype(np.float64) - want)
                if not np.all(error <= bounds[label] * scale + 1e-12):
                    raise AssertionError(f"{path} {label}: a result is outside its bound "
                                         f"(largest error {error.max():.3g})")
            variants[f"tfring {path}, {label}"] = lambda fn=fn: fn(inputs)
        if path == "flat":
            for matrix_rank in [int(r) for r in args.powersgd_ranks.split(",") if r]:
                powersgd = hvd.PowerSGD(rank=matrix_rank, start_iter=0,
                                        name=f"powersgd{matrix_rank}")
                fn = tf.function(lambda ts, p=powersgd: p.reduce_gradient_list(
                    ts, keys, {"op": hvd.Average}))
                variants[f"tfring flat, PowerSGD r={matrix_rank}"] = lambda fn=fn: fn(inputs)
            if args.raw_mpi:
                variants["raw MPI (mpi4py Allreduce, one buffer)"] = \
                    lambda: comm.Allreduce(MPI.IN_PLACE, flat_buffer)
        _progress(args, rank, f"{path}: timing {', '.join(variants)}")
        times.update(measure(comm, variants, args.repeats))
        if rank == 0:  # after each path, so a job that times out keeps them
            with open(args.results_file, "w") as f:
                json.dump({"times": {k: [float(t) for t in v] for k, v in times.items()}}, f)
        _progress(args, rank, f"{path}: tfring.shutdown()")
        hvd.shutdown()
    _progress(args, rank, "done")


# ------------------------------------------------ PowerSGD compute worker --

def powersgd_compute_worker(args):
    """PowerSGD's step at 1 rank on one core: its arithmetic alone."""
    import numpy as np
    import tensorflow as tf
    import tfring as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    with open(args.shapes_file) as f:
        shapes = [tuple(s) for s in json.load(f)]
    inputs = [tf.constant(_rank_values(0, s)) for s in shapes]
    keys = [f"g{i}" for i in range(len(shapes))]
    times = {}
    for matrix_rank in [int(r) for r in args.powersgd_ranks.split(",") if r]:
        powersgd = hvd.PowerSGD(rank=matrix_rank, start_iter=0, name=f"powersgd{matrix_rank}")
        fn = tf.function(lambda ts, p=powersgd: p.reduce_gradient_list(
            ts, keys, {"op": hvd.Average}))
        for _ in range(2):
            fn(inputs)
        wall, cpu = [], []
        for _ in range(args.repeats):
            started, started_cpu = time.perf_counter(), time.process_time()
            fn(inputs)[0].numpy()
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        times[matrix_rank] = (wall, cpu)
    hvd.shutdown()
    with open(args.results_file, "w") as f:
        json.dump({str(k): v for k, v in times.items()}, f)


def _powersgd_compute_alone(args, shapes_file):
    """Runs powersgd_compute_worker in a process of its own (outside the
    namespace hosts); returns {rank: (wall seconds[], cpu seconds[])}."""
    with tempfile.TemporaryDirectory(prefix="tfring-compute-") as tmp:
        results = os.path.join(tmp, "results.json")
        root = os.path.dirname(HERE)  # this checkout's tfring, as the workers use
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
                   TF_NUM_INTEROP_THREADS="1",
                   PYTHONPATH=os.pathsep.join(
                       p for p in [root, os.environ.get("PYTHONPATH", "")] if p))
        subprocess.run([sys.executable, os.path.abspath(__file__), "--worker-compute",
                        "--shapes-file", shapes_file, "--repeats", str(args.repeats),
                        "--powersgd-ranks", args.powersgd_ranks,
                        "--results-file", results],
                       check=True, stdin=subprocess.DEVNULL, env=env,
                       timeout=args.timeout)
        with open(results) as f:
            return {int(k): v for k, v in json.load(f).items()}


# -------------------------------------------------------------- DDP worker --

def ddp_worker(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from mpi4py import MPI
    from _timing import measure

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    _progress(args, rank, "DDP: init_process_group(gloo)")
    dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:29517",
                            rank=rank, world_size=size)
    with open(args.shapes_file) as f:
        shapes = [tuple(s) for s in json.load(f)]
    # Torch's layout: outputs first (Conv2d (out, in, h, w), Linear (out, in)).
    torch_shapes = [s[::-1] if len(s) == 2 else (s[3], s[2], s[0], s[1]) if len(s) == 4 else s
                    for s in shapes]

    class GradientSet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tensors = torch.nn.ParameterList(
                torch.nn.Parameter(torch.zeros(s)) for s in torch_shapes)

        def forward(self, scale):
            return sum((p * scale).sum() for p in self.tensors)

    def make(hook):
        # powerSGD_hook waits for allreduces inside its future callbacks,
        # which run on gloo's two worker threads: with two buckets whose
        # callbacks ran at once, both threads waited for allreduces that only
        # they could run, and DDP stalled. One bucket for the whole set keeps
        # one thread free.
        one_bucket_mb = sum(math.prod(s) for s in torch_shapes) * 4 / 2**20 + 1
        model = torch.nn.parallel.DistributedDataParallel(
            GradientSet(), bucket_cap_mb=one_bucket_mb if hook else None)
        if hook:
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=DDP_POWERSGD_RANK,
                start_powerSGD_iter=2)
            model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        scale = torch.tensor(float(rank + 1))

        def step():
            model.zero_grad(set_to_none=False)
            model(scale).backward()
        return step

    variants = {"torch DDP gloo, fp32": make(False),
                f"torch DDP gloo, PowerSGD hook r={DDP_POWERSGD_RANK}, one bucket": make(True)}
    _progress(args, rank, "DDP: timing")
    times = measure(comm, variants, args.repeats)
    _progress(args, rank, "done")
    dist.destroy_process_group()
    if rank == 0:
        with open(args.results_file, "w") as f:
            json.dump({"times": {k: [float(t) for t in v] for k, v in times.items()}}, f)


# ------------------------------------------------------------ orchestrator --

def _rate_bits(rate):
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not match:
        return None
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def _run_job(hosts, args, worker_args, label):
    with tempfile.TemporaryDirectory(prefix="tfring-cross-host-") as progress:
        results = os.path.join(progress, "results.json")
        try:
            finished = _namespace_hosts.run_workers(
                hosts, args, __file__,
                [*worker_args, "--progress-dir", progress, "--results-file", results],
                timeout=args.timeout)
        except subprocess.TimeoutExpired:
            where = []
            for name in sorted(n for n in os.listdir(progress) if n.startswith("rank")):
                with open(os.path.join(progress, name)) as f:
                    where.append(f"  {name.replace('rank', 'rank ')}: {f.read()}")
            raise SystemExit(f"the {label} job did not finish within {args.timeout:.0f} s; "
                             "where each rank was:\n" + ("\n".join(where) or "  nowhere yet"))
        if finished.returncode != 0 or not os.path.exists(results):
            raise SystemExit(f"the {label} job failed (exit {finished.returncode}); its "
                             "output is above")
        with open(results) as f:
            return json.load(f)


def orchestrate(args):
    import numpy as np
    shapes = gradient_shapes(args.set)
    total_bytes = 4 * sum(int(np.prod(s)) for s in shapes)
    print(f"gradient set: {args.set}, {len(shapes)} tensors, {total_bytes / 2**20:.1f} MiB",
          flush=True)
    started = time.time()
    with _namespace_hosts.namespace_hosts(args) as hosts, \
            tempfile.TemporaryDirectory(prefix="tfring-shapes-") as shapes_dir:
        shapes_file = os.path.join(shapes_dir, "shapes.json")
        with open(shapes_file, "w") as f:
            json.dump([list(s) for s in shapes], f)
        common = ["--shapes-file", shapes_file, "--repeats", str(args.repeats),
                  "--powersgd-ranks", args.powersgd_ranks, "--paths", args.paths,
                  "--wire", args.wire, "--raw-mpi" if args.raw_mpi else "--no-raw-mpi"]
        times, compute = {}, {}
        if args.compute_alone and args.only in (None, "tfring") and args.powersgd_ranks:
            print("PowerSGD compute alone (1 rank) ...", flush=True)
            compute = _powersgd_compute_alone(args, shapes_file)
        if args.only in (None, "tfring"):
            print("tfring job ...", flush=True)
            times.update(_run_job(hosts, args, common, "tfring")["times"])
        if args.only == "ddp" or (args.only is None and args.with_ddp):
            print("torch DDP job ...", flush=True)
            times.update(_run_job(
                hosts, args, [*common, "--worker-ddp", "--master-addr", hosts[0].address],
                "torch DDP")["times"])
    h = args.hosts
    rate = _rate_bits(args.link_rate)
    limit = (2 * (h - 1) / h * total_bytes * 8 / rate) if rate and h > 1 else None
    print(f"\n{h} hosts x {args.ranks_per_host} ranks, links {args.link_rate}, "
          f"{socket.gethostname()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.repeats} repetitions, {time.time() - started:.0f} s in all")
    if limit:
        print(f"fp32 link limit: {limit * 1e3:.0f} ms (2 (H-1)/H x {total_bytes / 2**20:.1f} "
              f"MiB at {args.link_rate})")
    print(f"| {'variant':<42} | {'median ms':>9} | {'min ms':>8} | {'link limit / median':>19} |")
    print(f"|{'-' * 44}|{'-' * 11}:|{'-' * 9}:|{'-' * 20}:|")
    for label, seconds in times.items():
        median = float(np.median(seconds))
        speedup = f"{limit / median:.2f}x" if limit else "-"
        print(f"| {label:<42} | {median * 1e3:9.0f} | {min(seconds) * 1e3:8.0f} | "
              f"{speedup:>19} |")
    for matrix_rank, (wall, cpu) in compute.items():
        print(f"PowerSGD r={matrix_rank} compute alone (1 rank, one core, no network): "
              f"median {np.median(wall) * 1e3:.0f} ms (CPU {np.median(cpu) * 1e3:.0f} ms), "
              f"min {min(wall) * 1e3:.0f} ms; here the {h * args.ranks_per_host} ranks "
              f"share this machine's {os.cpu_count()} cores")
    sys.stdout.flush()


if __name__ == "__main__":
    _namespace_hosts.main(parse_args, tfring_worker, orchestrate,
                          worker_compute=powersgd_compute_worker,
                          worker_ddp=ddp_worker)
