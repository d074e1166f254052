"""What Open MPI's fault-tolerant mode costs a job on several hosts.

    python benchmarks/fault_tolerance.py              # 2 namespace hosts x 2 ranks, 1 Gbit/s links
    python benchmarks/fault_tolerance.py --jobs 6 --repeats 20

tfringrun turns on Open MPI's fault-tolerant mode (ULFM, `--mca
mpi_ft_enable 1`) for jobs on several hosts, so that a rank that dies is
named in every survivor's error instead of ending the job from whichever
rank noticed first. This measures what that costs: it makes namespace hosts
as benchmarks/hierarchical.py does (needs root), then starts the same job
--jobs times, alternating mpi_ft_enable 0 and 1 so drift of the machine hits
both alike. Each job times, for 4 KiB, 4 MiB and the ResNet-50 gradient set
(float32 sums): tfring's allreduce (grouped_allreduce in a tf.function) and
mpi4py's Allreduce in place over every rank. Times are the slowest rank's
per repetition; the table gives, per case, the median over every job of a
setting and the ratio on / off (above 1: fault-tolerant mode is slower).
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
KIB, MIB = 1024, 1024 * 1024
RESULT_PREFIX = "FT_RESULT "

sys.path.insert(0, HERE)
import _namespace_hosts  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _namespace_hosts.add_arguments(parser)
    parser.add_argument("--jobs", type=int, default=4,
                        help="jobs to start, alternating off and on (default 4)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed repetitions per variant per job")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before one job is ended (default 600)")
    return parser.parse_args(argv)


# ------------------------------------------------------------------ worker --

def worker(args):
    import numpy as np
    from mpi4py import MPI
    import tensorflow as tf

    import tfring as hvd
    from _timing import check, describe_size, measure, rank_data
    from allreduce import resnet50_shapes

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    cases = [(describe_size(b), [(b // 4,)]) for b in (4 * KIB, 4 * MIB)]
    cases.append((f"ResNet-50 x{len(resnet50_shapes())}", resnet50_shapes()))

    @tf.function
    def reduce_all(ts):
        return hvd.grouped_allreduce(ts, op=hvd.Sum)

    medians = {}
    for name, shapes in cases:
        inputs = [tf.constant(rank_data(rank, s)) for s in shapes]
        expected = [sum(rank_data(r, s) for r in range(size)) for s in shapes]
        for got, want in zip(reduce_all(inputs), expected):
            check(name, got, want)
        # Zeroed buffers: sums of zeros stay zero, so repetitions need no refill.
        zeros = [np.zeros(s, np.float32) for s in shapes]
        variants = {
            "tfring": lambda: reduce_all(inputs),
            "raw MPI": lambda: [comm.Allreduce(MPI.IN_PLACE, b) for b in zeros],
        }
        for label, seconds in measure(comm, variants, args.repeats).items():
            medians[f"{name}|{label}"] = float(np.median(seconds))
        if rank == 0:
            print(f"  {name} measured at {time.time():.1f}", file=sys.stderr, flush=True)
    hvd.shutdown()
    if rank == 0:
        print(RESULT_PREFIX + json.dumps(medians), flush=True)


# ------------------------------------------------------------ orchestrator --

def run_job(hosts, args, ft_enabled):
    # tfringrun's own choice for several hosts is on; the environment
    # setting is how a user overrides it, and so how this picks each job's.
    try:
        finished = _namespace_hosts.run_workers(
            hosts, args, __file__, ["--repeats", str(args.repeats)],
            extra_env={"OMPI_MCA_mpi_ft_enable": "1" if ft_enabled else "0"},
            timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"a job did not finish within {args.timeout:.0f} s")
    for line in finished.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise SystemExit(f"a job (mpi_ft_enable={int(ft_enabled)}) failed with exit code "
                     f"{finished.returncode}:\n{finished.stdout}\n{finished.stderr}")


def report(args, results):
    import numpy as np
    keys = list(results[False][0])
    print(f"Open MPI fault-tolerant mode off / on: {args.hosts} hosts x "
          f"{args.ranks_per_host} ranks, {args.jobs} jobs alternating, "
          f"{args.repeats} repetitions each; median over the jobs of each "
          f"job's median, ms (slowest rank)")
    print(f"{'case':<16} {'variant':<8} {'off':>9} {'on':>9} {'on/off':>7}   "
          f"each job's median, ms: off | on")
    for key in keys:
        case, label = key.split("|")
        off = np.median([job[key] for job in results[False]])
        on = np.median([job[key] for job in results[True]])
        each = " | ".join(" ".join(f"{job[key] * 1e3:.3g}" for job in results[setting])
                          for setting in (False, True))
        print(f"{case:<16} {label:<8} {off * 1e3:9.3f} {on * 1e3:9.3f} {on / off:7.2f}   "
              f"{each}")
    sys.stdout.flush()


def orchestrate(args):
    results = {False: [], True: []}
    with _namespace_hosts.namespace_hosts(args) as hosts:
        for job in range(args.jobs):
            ft_enabled = job % 2 == 1
            results[ft_enabled].append(run_job(hosts, args, ft_enabled))
            print(f"job {job + 1}/{args.jobs} (mpi_ft_enable={int(ft_enabled)}) done",
                  flush=True)
    report(args, results)


if __name__ == "__main__":
    _namespace_hosts.main(parse_args, worker, orchestrate)
