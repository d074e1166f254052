"""What elastic training costs and how fast it recovers, against torchrun.

    python benchmarks/elastic.py                  # 3 ranks, the whole table
    python benchmarks/elastic.py --ranks 4 --repeats 3

The same small PyTorch model (an MLP, synthetic data) trains on --ranks
processes of this machine:

- recovery, tfring: `tfringrun --min-np` with tfring.torch.elastic
  (TorchState, commit every --commit-every steps); one rank kills itself
  with SIGKILL at step --kill-step. Recovery is the time from the kill to the
  first step completed after the reset, on the fastest survivor.
- recovery, torchrun: `torchrun --standalone` (c10d rendezvous) with
  `--max-restarts 3` and DistributedDataParallel over Gloo; rank 0 saves a
  checkpoint every --commit-every steps and the restarted workers load it.
  Recovery is the time from the kill to the first step completed by the
  restarted workers.
- per-step cost of elastic mode: the mean step time of tfringrun with and
  without the elastic options (no failure), and their ratio. Elastic mode
  moves data over MPI only (no shared-memory path) and runs Open MPI's
  fault-tolerant mode.
- growth, tfring: a job of --ranks - 1 ranks with a host discovery script
  (polled every second, the default); at step --grow-step rank 0 makes the
  script list one more slot. Growth is the time from that change to the
  first step completed by the new rank (the poll, the next commit(), the
  new process's start-up with Python and PyTorch, the merge and the state's
  broadcast).
- commit(): the time of TorchState.commit() (copies of the model's and
  optimizer's state) by model size, in one process; then the same in an
  elastic job's setting, where each host's first rank also keeps the commit
  on disk for a restart after a lost host (tfring/elastic/kept_commit.py):
  the time commit() takes there, and the time until the file is written
  (on a thread of its own, while training goes on).

    python benchmarks/elastic.py --namespace-hosts   # as root, on Linux

measures instead across 2 namespace hosts (benchmarks/_namespace_hosts.py)
with --ranks-per-host ranks each: the recovery after every rank of the
second host dies at once (SIGKILL; its PRRTE daemon stays, see
docs/elastic.md), at 2 x --ranks-per-host ranks; the recovery after the
second host's PRRTE daemon dies with its ranks (PRRTE ends the job,
tfringrun starts it again on the first host, which resumes from the commit
it kept on disk: the time from the kill to the first step of the new
launch, and the steps redone); and the growth of a job on the first host
onto one slot of the second host (the time from the discovery script's
change to the new rank's first step).

Each worker prints timestamped lines; this script reads them. Every job runs
under a timeout.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB_TIMEOUT_S = 300


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=["tfring", "torchrun", "commit"],
                        help="run as one rank of a job (internal)")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--kill-step", type=int, default=23,
                        help="the step at which a rank dies (-1: none)")
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--grow-step", type=int, default=-1,
                        help="tfring worker: the step at which rank 0 lists one "
                             "more slot (internal; -1: none)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="jobs per measurement (the median is reported)")
    parser.add_argument("--checkpoint", default="",
                        help="torchrun worker: the checkpoint file (internal)")
    parser.add_argument("--namespace-hosts", action="store_true",
                        help="measure a whole host's loss and growth onto a "
                             "new host across 2 namespace hosts (root only)")
    parser.add_argument("--ranks-per-host", type=int, default=2,
                        help="with --namespace-hosts: ranks on each host")
    parser.add_argument("--kill-from", type=int, default=-1,
                        help="tfring worker: ranks from this one on die at "
                             "--kill-step (internal; -1: the last rank)")
    parser.add_argument("--kill-daemon", action="store_true",
                        help="tfring worker: the ranks that die kill their "
                             "host's PRRTE daemon first (internal)")
    return parser.parse_args(argv)


# --- the workers -----------------------------------------------------------

def _model_and_data(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10))
    x = torch.randn(32, 256)
    y = torch.randint(0, 10, (32,))
    return model, x, y


def _kill_host_daemon_and_die(label):
    """Kills this rank's parent if it is a host's PRRTE daemon (prted), the
    whole host lost, then this rank. The daemon carries the rank's output:
    the KILL record goes out half a second before, with the kill's time."""
    import signal
    kill_at = time.time() + 0.5
    print(f"KILL {kill_at:.6f} {label}", flush=True)
    time.sleep(max(0.0, kill_at - time.time()))
    daemon = os.getppid()
    with open(f"/proc/{daemon}/comm") as f:
        if f.read().strip() == "prted":  # a host-mate may have killed it
            os.kill(daemon, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_now(label):
    import signal
    print(f"KILL {time.time():.6f} {label}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def tfring_worker(args):
    import torch
    torch.set_num_threads(1)
    import tfring.torch as hvd

    hvd.init()
    original_rank = hvd.rank()
    model, x, y = _model_and_data(torch)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    state.register_reset_callbacks(
        [lambda: print(f"RESET {time.time():.6f} {original_rank}", flush=True)])

    restarts = int(os.environ.get("TFRING_ELASTIC_RESTARTS", "0"))

    @hvd.elastic.run
    def train(state):
        print(f"STARTED {time.time():.6f} {original_rank} {state.step} "
              f"{restarts}", flush=True)
        while state.step < args.steps:
            first_killed = args.kill_from if args.kill_from >= 0 else args.ranks - 1
            if (original_rank >= first_killed and state.step == args.kill_step
                    and not restarts):
                if args.kill_daemon:
                    _kill_host_daemon_and_die(original_rank)
                _kill_now(original_rank)
            if args.grow_step >= 0 and state.step >= args.grow_step:
                if original_rank == 0 and state.step == args.grow_step:
                    _list_one_more_slot(args)
                time.sleep(0.05)  # steps go on until the poll sees it
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            state.step += 1
            print(f"STEP {time.time():.6f} {original_rank} {state.step}",
                  flush=True)
            if state.step % args.commit_every == 0:
                state.commit()

    train(state)


def _list_one_more_slot(args):
    listing = os.environ.get("TFRING_BENCH_NEW_HOSTS", f"localhost:{args.ranks}\n")
    with open(os.environ["TFRING_BENCH_HOSTS_FILE"], "w") as f:
        f.write(listing)
    print(f"DISCOVERED {time.time():.6f} 0", flush=True)


def torchrun_worker(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # The agent's store outlives a restart; Gloo's keys of the previous
    # workers would send the new ones to dead addresses: a prefix per restart.
    store = dist.PrefixStore(f"restart{restart}", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
        is_master=False))
    dist.init_process_group("gloo", store=store,
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    model, x, y = _model_and_data(torch)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    step = 0
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    while step < args.steps:
        if restart == 0 and rank == args.ranks - 1 and step == args.kill_step:
            _kill_now(rank)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        step += 1
        print(f"STEP {time.time():.6f} {rank} {step} {restart}", flush=True)
        if step % args.commit_every == 0 and rank == 0:
            partial = args.checkpoint + ".partial"
            torch.save({"model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "step": step},
                       partial)
            os.replace(partial, args.checkpoint)
    dist.destroy_process_group()


def commit_worker(args):
    import torch
    torch.set_num_threads(1)
    import tfring.torch as hvd
    from tfring.elastic import kept_commit

    hvd.init()
    for millions in (1, 10, 50):
        width = int((millions * 1e6) ** 0.5)
        model = torch.nn.Linear(width, width, bias=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(1, width)).sum().backward()
        optimizer.step()  # the momentum buffers exist
        state = hvd.elastic.TorchState(model, optimizer, step=0)
        in_memory = _commit_times(state, None)
        with tempfile.TemporaryDirectory() as folder:
            os.environ.update(TFRING_ELASTIC="1",
                              TFRING_ELASTIC_COMMIT_DIR=folder)
            kept = kept_commit.for_this_job()
            on_disk = _commit_times(state, kept)
            del os.environ["TFRING_ELASTIC"]
        print(f"COMMIT {millions} {in_memory[0]:.6f} {on_disk[0]:.6f} "
              f"{on_disk[1]:.6f}", flush=True)


def _commit_times(state, kept):
    """Medians of 5: commit()'s time, and (with `kept`) the time until the
    commit is on disk."""
    calls, written = [], []
    for _ in range(5):
        if kept is not None:
            kept._not_before = 0.0  # time the write alone, not the rest after it
        start = time.perf_counter()
        state.commit()
        calls.append(time.perf_counter() - start)
        if kept is not None:
            kept.wait()
            written.append(time.perf_counter() - start)
    return statistics.median(calls), statistics.median(written or [0.0])


# --- the jobs --------------------------------------------------------------

def _environment():
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="2", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _run(command, **extra_env):
    result = subprocess.run(command, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=JOB_TIMEOUT_S,
                            env=dict(_environment(), **extra_env), cwd=ROOT)
    return result.stdout


def _worker_args(args, kill_step):
    return ["--ranks", str(args.ranks), "--steps", str(args.steps),
            "--kill-step", str(kill_step), "--commit-every", str(args.commit_every)]


def _tfringrun(args, elastic, kill_step, options=(), **extra_env):
    command = [sys.executable, "-m", "tfring.launcher.cli", "-np", str(args.ranks)]
    if elastic:
        command += ["--min-np", "1"]
    return _run(command + list(options) + [
        sys.executable, __file__, "--worker", "tfring",
        *_worker_args(args, kill_step)], **extra_env)


_FIELDS = {"KILL": 2, "RESET": 2, "COMMIT": 4, "STEP": 3, "DISCOVERED": 2,
           "STARTED": 4}


def _lines(output, kind, fields=None):
    """The fields of every `kind` record (ranks' lines may interleave)."""
    count = fields or _FIELDS[kind]
    pattern = rf"\b{kind}((?: [0-9.]+){{{count}}})"
    return [match.group(1).split() for match in re.finditer(pattern, output)]


def _recovery_tfring(output):
    kills = _lines(output, "KILL")
    if not kills:
        raise RuntimeError("no rank was killed:\n" + output[-4000:])
    killed_at = min(float(kill[0]) for kill in kills)
    resets = {rank: float(t) for t, rank in _lines(output, "RESET")}
    after = [float(t) for t, rank, _ in _lines(output, "STEP")
             if rank in resets and float(t) > resets[rank]]
    if not after:
        raise RuntimeError("no step completed after the reset:\n" + output[-4000:])
    return min(after) - killed_at


def _restart_tfring(output, kill_step):
    """Seconds from a host's loss (its daemon killed) to the first step of
    the launch tfringrun started again, and the steps that launch redid."""
    kills = _lines(output, "KILL")
    restarted = [(float(t), int(step)) for t, _, step, restarts in
                 _lines(output, "STARTED") if int(restarts) > 0]
    if not kills or not restarted:
        raise RuntimeError("no host was lost, or the job did not start "
                           "again:\n" + output[-4000:])
    started_at = min(t for t, _ in restarted)
    after = [float(t) for t, _, _ in _lines(output, "STEP")
             if float(t) > started_at]
    if not after:
        raise RuntimeError("no step after the restart:\n" + output[-4000:])
    killed_at = min(float(kill[0]) for kill in kills)
    return min(after) - killed_at, kill_step - max(step for _, step in restarted)


def _growth_tfring(args, run=None, hosts=None, first_listing=None,
                   new_listing=None):
    """Seconds from the discovery script's new slot to the new rank's first
    step, in a job that starts one rank short (on `hosts`, -H's `host:slots`
    list, listed as `first_listing` and then `new_listing`)."""
    grow_step = 10
    run = run or _run
    hosts = hosts or f"localhost:{args.ranks}"
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)  # the namespace hosts' ranks read it too
        hosts_file = os.path.join(folder, "hosts")
        script = os.path.join(folder, "discover.sh")
        with open(hosts_file, "w") as f:
            f.write(first_listing or f"localhost:{args.ranks - 1}\n")
        with open(script, "w") as f:
            f.write(f'#!/bin/sh\ncat "{hosts_file}"\n')
        os.chmod(script, 0o755)
        command = [sys.executable, "-m", "tfring.launcher.cli",
                   "-np", str(args.ranks - 1), "--min-np", "1",
                   "--max-np", str(args.ranks), "-H", hosts,
                   "--host-discovery-script", script,
                   sys.executable, __file__, "--worker", "tfring",
                   *_worker_args(args, -1), "--grow-step", str(grow_step)]
        extra = {"TFRING_BENCH_HOSTS_FILE": hosts_file}
        if new_listing:
            extra["TFRING_BENCH_NEW_HOSTS"] = new_listing
        output = run(command, **extra)
    [discovered] = _lines(output, "DISCOVERED")
    new_rank = str(args.ranks - 1)
    first = [float(t) for t, rank, _ in _lines(output, "STEP") if rank == new_rank]
    if not first:
        raise RuntimeError("the new rank completed no step:\n" + output[-4000:])
    return min(first) - float(discovered[0])


def _namespace_hosts_table(args):
    """Recovery from a whole host's loss and growth onto a new host, across
    2 namespace hosts; prints the table."""
    import types
    sys.path.insert(0, HERE)
    import _namespace_hosts

    per_host = args.ranks_per_host
    setup = types.SimpleNamespace(hosts=2, ranks_per_host=per_host,
                                  link_rate="1gbit")
    recoveries, restarts, growths = [], [], []
    with _namespace_hosts.namespace_hosts(setup) as hosts:
        names = [host.name for host in hosts.hosts]

        def run(command, **extra_env):
            env = dict(extra_env, **hosts.mpi_env())
            env.setdefault(_namespace_hosts.YIELD_VARIABLE, "1")
            return _run(hosts[0].enter(command, cwd=ROOT), **env)

        everyone = ",".join(f"{name}:{per_host}" for name in names)
        lost = argparse.Namespace(**vars(args))
        lost.ranks = 2 * per_host
        grown = argparse.Namespace(**vars(args))
        grown.ranks = per_host + 1
        for _ in range(args.repeats):
            command = [sys.executable, "-m", "tfring.launcher.cli",
                       "-np", str(lost.ranks), "--min-np", "1", "-H", everyone,
                       sys.executable, __file__, "--worker", "tfring",
                       *_worker_args(lost, args.kill_step),
                       "--kill-from", str(per_host)]
            recoveries.append(_recovery_tfring(run(command)))
            restarts.append(_restart_tfring(
                run(command + ["--kill-daemon"]), args.kill_step))
            growths.append(_growth_tfring(
                grown, run, everyone, f"{names[0]}:{per_host}\n",
                f"{names[0]}:{per_host}\n{names[1]}:1\n"))
    when = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    print(f"| measured (2 namespace hosts x {per_host} ranks, {when}, "
          f"median of {args.repeats}) | value |")
    print("|---|---|")
    print(f"| recovery after every rank of one host died, {2 * per_host} to "
          f"{per_host} ranks | {statistics.median(recoveries):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in recoveries)}) |")
    print(f"| recovery after one host's PRRTE daemon died with its ranks "
          f"(tfringrun starts the job again on the other host, from the "
          f"commit it kept on disk), {2 * per_host} to {per_host} ranks | "
          f"{statistics.median(t for t, _ in restarts):.2f} s "
          f"({', '.join(f'{t:.2f}' for t, _ in restarts)}; steps redone: "
          f"{', '.join(str(n) for _, n in restarts)}) |")
    print(f"| growth onto the other host: its new slot listed to the new rank's "
          f"first step, {per_host} to {per_host + 1} ranks | "
          f"{statistics.median(growths):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in growths)}) |")


def _recovery_torchrun(args, checkpoint):
    command = [os.path.join(os.path.dirname(sys.executable), "torchrun"),
               "--standalone", "--nnodes", "1", "--nproc-per-node", str(args.ranks),
               "--max-restarts", "3", __file__, "--worker", "torchrun",
               "--checkpoint", checkpoint, *_worker_args(args, args.kill_step)]
    output = _run(command)
    [kill] = _lines(output, "KILL")
    after = [float(t) for t, _, _, restart in _lines(output, "STEP", 4)
             if int(restart) > 0]
    if not after:
        raise RuntimeError("torchrun restarted no step:\n" + output[-4000:])
    return min(after) - float(kill[0])


def _mean_step(output, skip=10):
    times = sorted(float(t) for t, rank, _ in _lines(output, "STEP") if rank == "0")
    steady = times[skip:]
    return (steady[-1] - steady[0]) / (len(steady) - 1)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        {"tfring": tfring_worker, "torchrun": torchrun_worker,
         "commit": commit_worker}[args.worker](args)
        return
    if args.namespace_hosts:
        _namespace_hosts_table(args)
        return
    tfring_times, torchrun_times, plain_steps, elastic_steps = [], [], [], []
    mpi_only_steps, in_memory_steps = [], []
    growth_times = []
    for _ in range(args.repeats):
        growth_times.append(_growth_tfring(args))
        tfring_times.append(_recovery_tfring(_tfringrun(args, True, args.kill_step)))
        with tempfile.TemporaryDirectory() as folder:
            torchrun_times.append(
                _recovery_torchrun(args, os.path.join(folder, "checkpoint.pt")))
        plain_steps.append(_mean_step(_tfringrun(args, False, -1)))
        elastic_steps.append(_mean_step(_tfringrun(args, True, -1)))
        # What elastic mode changes, one at a time: MPI only (no
        # shared-memory path), and commits kept on disk.
        mpi_only_steps.append(_mean_step(_tfringrun(args, False, -1,
                                                    TFRING_SHM="0")))
        in_memory_steps.append(_mean_step(_tfringrun(
            args, True, -1, ["--elastic-commit-dir", "none"])))
    commits = _lines(_run([sys.executable, __file__, "--worker", "commit"]), "COMMIT")
    recovery, restart = statistics.median(tfring_times), statistics.median(torchrun_times)
    plain, elastic = statistics.median(plain_steps), statistics.median(elastic_steps)
    print(f"| measured ({args.ranks} ranks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}) | value |")
    print("|---|---|")
    print(f"| recovery after a rank's death, tfring elastic | {recovery:.2f} s |")
    print(f"| recovery after a rank's death, torchrun --max-restarts (checkpoint every "
          f"{args.commit_every} steps) | {restart:.2f} s ({restart / recovery:.0f}x) |")
    print(f"| growth: a discovered slot to the new rank's first step, tfring elastic "
          f"({args.ranks - 1} to {args.ranks} ranks) | "
          f"{statistics.median(growth_times):.2f} s |")
    print(f"| step time, tfringrun | {plain * 1e3:.1f} ms |")
    print(f"| step time, tfringrun elastic (no failure) | {elastic * 1e3:.1f} ms "
          f"({elastic / plain:.2f}x) |")
    mpi_only = statistics.median(mpi_only_steps)
    in_memory = statistics.median(in_memory_steps)
    print(f"| step time, tfringrun without shared memory (TFRING_SHM=0, as "
          f"elastic jobs run) | {mpi_only * 1e3:.1f} ms ({mpi_only / plain:.2f}x) |")
    print(f"| step time, tfringrun elastic, commits in memory only "
          f"(--elastic-commit-dir none) | {in_memory * 1e3:.1f} ms "
          f"({in_memory / plain:.2f}x) |")
    for millions, in_memory, kept_call, kept_written in commits:
        print(f"| commit() of a {millions}M-parameter model and its SGD momentum | "
              f"{float(in_memory) * 1e3:.1f} ms; kept on disk too: "
              f"{float(kept_call) * 1e3:.1f} ms, written after "
              f"{float(kept_written) * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
