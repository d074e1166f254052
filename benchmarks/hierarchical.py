"""Hierarchical against flat allreduce across hosts, with raw MPI alongside.

    python benchmarks/hierarchical.py              # 2 namespace hosts x 2 ranks, 1 Gbit/s links
    python benchmarks/hierarchical.py --link-rate 200mbit --repeats 10
    tfringrun -np 8 -H node1:4,node2:4 python benchmarks/hierarchical.py --worker   # real hosts

Without --worker, this machine plays the hosts: network namespaces joined by
a bridge (tools/netns_hosts.py), each with its own host name and /dev/shm,
the link of every host limited to --link-rate with a token-bucket filter, so
that, as on a cluster, the network between hosts is the bottleneck and the
ranks of one host share memory. Then it runs itself with --worker on every
rank through tfringrun, from the first host. Needs root (CAP_NET_ADMIN).

The worker reduces float32 tensors of 4 KiB, 4 MiB and 64 MiB and the
ResNet-50 gradient set (214 tensors, grouped_allreduce in a tf.function)
three ways in the same job: tfring with TFRING_HIERARCHICAL_ALLREDUCE=0
(flat: one MPI allreduce over every rank), tfring with =1 (inside each
host, then one slice per local rank across hosts, then inside the host),
and mpi4py's Allreduce in place over every rank (raw MPI). tfring is
restarted (shutdown, init) between its two settings; the settings take turns
in rounds, so drift of the machine hits them alike. Every result is checked
once before timing. Times are the slowest rank's per repetition; the table
gives medians and minimums and the ratios hierarchical / flat and
hierarchical / raw MPI (below 1: hierarchical is faster).
"""

import argparse
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))

sys.path.insert(0, HERE)
import _namespace_hosts  # noqa: E402

PATHS = {"flat": "0", "hierarchical": "1"}
KIB, MIB = 1024, 1024 * 1024


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _namespace_hosts.add_arguments(parser)
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed repetitions per variant per round")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of flat / hierarchical (default 2)")
    parser.add_argument("--timeout", type=float, default=1200,
                        help="seconds before the job is ended (default 1200)")
    parser.add_argument("--progress-dir", default=None,
                        help="(worker) where each rank writes the step it is at, so "
                             "a job that does not finish says where it was")
    return parser.parse_args(argv)


def _progress(args, rank, text):
    """Records that this rank is now at `text` (the orchestrator quotes
    every rank's last one if the job does not finish in time)."""
    if args.progress_dir:
        with open(os.path.join(args.progress_dir, f"rank{rank}"), "w") as f:
            f.write(text)


# ------------------------------------------------------------------ worker --

def worker(args):
    import numpy as np
    from mpi4py import MPI
    import tensorflow as tf

    import tfring as hvd
    from _timing import check, describe_size, measure, rank_data
    from allreduce import resnet50_shapes

    tf.config.threading.set_intra_op_parallelism_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    cases = [(describe_size(b), [(b // 4,)]) for b in (4 * KIB, 4 * MIB, 64 * MIB)]
    cases.append((f"ResNet-50 x{len(resnet50_shapes())}", resnet50_shapes()))
    inputs = {name: [tf.constant(rank_data(rank, s)) for s in shapes]
              for name, shapes in cases}
    expected = {name: [sum(rank_data(r, s) for r in range(size)) for s in shapes]
                for name, shapes in cases}
    in_place = {name: [np.empty(s, np.float32) for s in shapes]
                for name, shapes in cases}

    @tf.function
    def reduce_all(ts):
        return hvd.grouped_allreduce(ts, op=hvd.Sum)

    times = {}  # (case, variant) -> [seconds]
    hosts_seen = None
    for round_index in range(args.rounds):
        order = list(PATHS) if round_index % 2 == 0 else list(PATHS)[::-1]
        for path in order:
            os.environ["TFRING_HIERARCHICAL_ALLREDUCE"] = PATHS[path]
            step = f"round {round_index + 1}/{args.rounds}, {path}"
            _progress(args, rank, f"{step}: tfring.init()")
            hvd.init()
            hosts_seen = hvd.size() // hvd.local_size()
            want = "hierarchical" if path == "hierarchical" and hosts_seen > 1 \
                and hvd.local_size() > 1 else None
            if want and hvd.data_path() != want:
                raise RuntimeError(f"TFRING_HIERARCHICAL_ALLREDUCE=1 but tfring chose "
                                   f"{hvd.data_path()!r}")
            for name, _ in cases:
                _progress(args, rank, f"{step}: checking, then timing {name}")
                for got, want_value in zip(reduce_all(inputs[name]), expected[name]):
                    check(f"{path} {name}", got, want_value)
                variants = {f"tfring {path}": lambda n=name: reduce_all(inputs[n])}
                if path == order[0]:
                    # Raw MPI in place on zeroed buffers (sums of zeros stay
                    # zero, so repetitions need no refill).
                    for buf in in_place[name]:
                        buf.fill(0)
                    variants["mpi4py Allreduce in place"] = \
                        lambda n=name: [comm.Allreduce(MPI.IN_PLACE, b)
                                        for b in in_place[n]]
                for label, seconds in measure(comm, variants, args.repeats).items():
                    times.setdefault((name, label), []).extend(seconds)
            _progress(args, rank, f"{step}: tfring.shutdown()")
            hvd.shutdown()
    _progress(args, rank, "done timing; rank 0 reports")
    if rank == 0:
        report(args, cases, times, size, hosts_seen)


def report(args, cases, times, size, hosts):
    import numpy as np
    print(f"hierarchical vs flat allreduce: {size} ranks on {hosts} hosts "
          f"({socket.gethostname()} first), {args.rounds} rounds x {args.repeats} "
          f"repetitions; float32 sums; times are the slowest rank's")
    print(f"{'case':<16} {'variant':<28} {'median ms':>10} {'min ms':>9} "
          f"{'/flat':>7} {'/raw MPI':>9}")
    for name, _ in cases:
        flat = times[(name, "tfring flat")]
        raw = times[(name, "mpi4py Allreduce in place")]
        for label in ("mpi4py Allreduce in place", "tfring flat", "tfring hierarchical"):
            t = times[(name, label)]
            ratios = ""
            if label == "tfring hierarchical":
                ratios = (f"{np.median(t) / np.median(flat):7.2f} "
                          f"{np.median(t) / np.median(raw):9.2f}")
            elif label == "tfring flat":
                ratios = f"{'':7} {np.median(t) / np.median(raw):9.2f}"
            print(f"{name:<16} {label:<28} {np.median(t) * 1e3:10.3f} "
                  f"{np.min(t) * 1e3:9.3f} {ratios}")
    sys.stdout.flush()


# ------------------------------------------------------------ orchestrator --

def orchestrate(args):
    import subprocess
    import tempfile
    with _namespace_hosts.namespace_hosts(args) as hosts, \
            tempfile.TemporaryDirectory(prefix="tfring-hierarchical-") as progress:
        try:
            finished = _namespace_hosts.run_workers(
                hosts, args, __file__,
                ["--repeats", str(args.repeats), "--rounds", str(args.rounds),
                 "--progress-dir", progress],
                timeout=args.timeout)
        except subprocess.TimeoutExpired:
            where = []
            for name in sorted(os.listdir(progress), key=lambda n: int(n[len("rank"):])):
                with open(os.path.join(progress, name)) as f:
                    where.append(f"  {name.replace('rank', 'rank ')}: {f.read()}")
            raise SystemExit(
                f"the benchmark did not finish within {args.timeout:.0f} s; where "
                f"each rank was:\n" + ("\n".join(where) or
                                       "  no rank got as far as tfring.init()"))
        raise SystemExit(finished.returncode)


if __name__ == "__main__":
    _namespace_hosts.main(parse_args, worker, orchestrate)
