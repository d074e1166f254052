"""The namespace hosts that the cross-host benchmarks (hierarchical.py,
fault_tolerance.py, cross_host.py, compression_accuracy.py) measure on, and
their shared options and entry point.

Each host is a network namespace with its own host name and /dev/shm
(tools/netns_hosts.py), and every host's link is limited with a
token-bucket filter so that, as on a cluster, the network between hosts is
the bottleneck while the ranks of one host share memory. The benchmark then
runs itself with --worker on every rank through tfringrun, from the first
host. Needs root (CAP_NET_ADMIN).

What the model leaves out, and what it puts back:
  * The link: the filter's 256 KiB burst and 50 ms queue (6 MB at 1 Gbit/s)
    drop nothing here: 64 MiB allreduces across 2 hosts x 2 ranks counted
    no qdisc drops and no TCP retransmission timeouts, so the deeper buffer
    of a real switch port would change nothing.
  * The cores: every rank of every host runs on this machine's cores, often
    more ranks than cores, where a real host has a core per rank. Open MPI
    busy-polls while a rank waits, and its hierarchical allreduce
    (coll/han, which it picks for a communicator spanning hosts with
    several ranks on each) hands every 64 KiB segment between the ranks of
    a host: each hand-off waited for a spinning rank's time slice, and a
    flat allreduce of 64-98 MiB took 13-48 s while the filter never once
    had to hold a packet back. So the ranks yield while they wait
    (OMPI_MCA_mpi_yield_when_idle=1 unless set), as tfring asks for where
    it starts MPI itself; the benchmark workers start MPI through mpi4py.
"""

import contextlib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Open MPI yields the core while a rank waits instead of spinning.
YIELD_VARIABLE = "OMPI_MCA_mpi_yield_when_idle"


def add_arguments(parser):
    """The options every namespace-host benchmark takes."""
    parser.add_argument("--worker", action="store_true",
                        help="measure (run on every rank under tfringrun/mpirun)")
    parser.add_argument("--hosts", type=int, default=2,
                        help="namespace hosts to make (default 2)")
    parser.add_argument("--ranks-per-host", type=int, default=2,
                        help="ranks on each namespace host (default 2)")
    parser.add_argument("--link-rate", default="1gbit",
                        help="each namespace host's link rate, as tc writes "
                             "it (default 1gbit; 'none' for no limit)")


def main(parse_args, worker, orchestrate, argv=None, **mode_workers):
    """A namespace-host benchmark's entry point: parses `argv`; runs
    `worker(args)` with --worker (on every rank), the worker of the first
    other mode set (`mode_workers` maps an option's destination, as
    worker_ddp for --worker-ddp, to its worker), else `orchestrate(args)`
    (make the hosts, start the workers)."""
    args = parse_args(argv)
    for mode, mode_worker in mode_workers.items():
        if getattr(args, mode):
            return mode_worker(args)
    return (worker if args.worker else orchestrate)(args)


def limit_link(host, rate):
    """Limits what `host` sends to the other hosts to `rate` (a token-bucket
    filter on its only link), as a cluster's network limits each machine."""
    if rate == "none":
        return
    subprocess.run(["ip", "netns", "exec", host.namespace, "tc", "qdisc", "add", "dev",
                    "eth0", "root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"],
                   check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def namespace_hosts(args):
    """Makes args.hosts hosts with limited links; yields them, torn down
    after."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import netns_hosts  # noqa: E402

    why_not = netns_hosts.unavailable_reason()
    if why_not:
        raise SystemExit(f"cannot make namespace hosts here: {why_not}. Run as root "
                         "on Linux, or run the worker across real hosts with "
                         "tfringrun ... --worker.")
    names = [f"host{chr(ord('a') + i)}" for i in range(args.hosts)]
    with netns_hosts.NetnsHosts(names) as hosts:
        for host in hosts.hosts:
            limit_link(host, args.link_rate)
        print(f"{args.hosts} namespace hosts x {args.ranks_per_host} ranks, each host's "
              f"link limited to {args.link_rate}", flush=True)
        yield hosts


def run_workers(hosts, args, script, worker_args, extra_env=None, **run_kwargs):
    """Runs `script --worker worker_args` on every rank of `hosts` through
    tfringrun, started from the first host; returns subprocess.run's
    result (run_kwargs go to it)."""
    names = [host.name for host in hosts.hosts]
    env = dict(os.environ, **hosts.mpi_env(), **(extra_env or {}))
    env.setdefault(YIELD_VARIABLE, "1")  # the hosts share cores (see the top)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH", "")] if p)
    command = [sys.executable, "-m", "tfring.launcher.cli",
               "-np", str(len(names) * args.ranks_per_host),
               "-H", ",".join(f"{n}:{args.ranks_per_host}" for n in names),
               sys.executable, os.path.abspath(script), "--worker", *worker_args]
    return subprocess.run(hosts[0].enter(command, cwd=ROOT), env=env, **run_kwargs)
