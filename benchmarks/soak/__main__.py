"""Soak test: a long tfring job keeps its memory and its results right.

    tfringrun -np 3 python benchmarks/soak [--steps 2000] [--seed 0]
        [--json PATH]

Why: unit tests run each collective a few times; a training job runs
thousands of steps, where a small leak per step, a cache that misbehaves
once full, or a rare ordering of concurrent submissions shows up. This
script runs `--steps` steps of random mixed collectives (allreduce with
every op, allgather, broadcast, alltoall, reducescatter, single and
grouped, eager and inside tf.function, from the main thread and from worker
threads in a different order on every rank; benchmarks/soak/plan.py says
what varies), checks every result, and watches its own process.

Checks (the exit status is 1 when one fails):
  results  every output equals the NumPy reference computed from every
           rank's input (exact for integers, bool and data movement; within
           a rounding bound for floating-point reductions), and every eager
           input is unchanged afterwards. A mismatch is printed at once,
           naming the step, item, call, dtype, op and rank, and the run goes
           on so that the report lists them all.
  memory   resident memory (/proc/self/statm) at the end minus after the
           warm-up, on every rank, at most --max-growth-mib (default 50).
  threads  Python threads and all threads (/proc/self/task) at the end no
           more than after the warm-up.
  fds      open file descriptors (/proc/self/fd) likewise.
Reported, not checked: the time per step (the collectives only, each step's
slowest rank) in windows, to show whether it drifts over the run.

A step that has not finished after --step-timeout seconds (a hang) ends the
job: the rank prints the step and the items still pending, and aborts MPI.
Rank 0 gathers every rank's figures (mpi4py: the referee does not depend
on the code under test), prints the report and writes it with --json.
"""

import argparse
import collections
import datetime
import json
import logging
import os
import platform
import socket
import sys
import threading
import time

PROCESS_STARTED = time.perf_counter()  # before TensorFlow is imported

# TensorFlow's C++ info logs would drown the report.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402  (mpi4py initialises MPI, tfring joins)
import tensorflow as tf  # noqa: E402

import tfring as hvd  # noqa: E402
import tfring._core  # noqa: E402

# The package's other modules: `python benchmarks/soak` puts this folder
# first on sys.path, the package itself needs its parent.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from soak import calls  # noqa: E402
from soak import plan  # noqa: E402
from soak import reference  # noqa: E402
from soak import report  # noqa: E402
from soak import resources  # noqa: E402

SELF_TESTS = ("corrupt-reference", "leak-memory", "leak-thread", "leak-fd")
PRINTED_FAILURES_PER_RANK = 20


def self_tests(text):
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in SELF_TESTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown self-test(s) {unknown}; expected a comma-separated "
            f"subset of {','.join(SELF_TESTS)}")
    return set(chosen)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000,
                        help="steps to run (default 2000)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the plan and the data (default 0)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="steps before the memory, thread and fd "
                             "baseline (default: a quarter of --steps)")
    parser.add_argument("--sample-every", type=int, default=None,
                        help="steps between resource samples (default: "
                             "steps / 40, at least 1)")
    parser.add_argument("--window-steps", type=int, default=None,
                        help="steps per step-time window (default: "
                             "steps / 10, at least 1)")
    parser.add_argument("--max-growth-mib", type=float, default=50.0,
                        help="allowed resident memory growth after the "
                             "warm-up, per rank (default 50)")
    parser.add_argument("--step-timeout", type=float, default=300.0,
                        help="seconds a step may take before the job is "
                             "aborted as hung (default 300)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the report as JSON to PATH")
    parser.add_argument("--intra-op-threads", type=int, default=1,
                        help="TensorFlow intra-op threads per rank (default "
                             "1; 0 for TensorFlow's default)")
    # Proves that each check can fail: a wrong reference, a memory, thread
    # or fd leak planted after the warm-up (used by tests/test_soak.py).
    parser.add_argument("--self-test", type=self_tests, default=set(),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.warmup_steps is None:
        args.warmup_steps = args.steps // 4
    if not 0 <= args.warmup_steps < args.steps:
        parser.error("--warmup-steps must be in [0, --steps)")
    if args.sample_every is None:
        args.sample_every = max(1, args.steps // 40)
    if args.window_steps is None:
        args.window_steps = max(1, args.steps // 10)
    return args


def config_value(env_name):
    for entry in tfring._core.config():
        if entry["env"] == env_name:
            return entry["value"]
    raise KeyError(env_name)


class Watchdog:
    """Aborts the job when a step takes longer than `timeout` seconds,
    after printing what this rank is still waiting for."""

    def __init__(self, timeout, rank, runner):
        self.timeout = timeout
        self.rank = rank
        self.runner = runner
        self.step = None
        self.started = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="soak-watchdog")
        self._thread.start()

    def begin(self, step):
        self.step, self.started = step, time.monotonic()

    def end(self):
        self.started = None

    def _watch(self):
        while not self._stop.wait(1.0):
            started = self.started
            if started is None or time.monotonic() - started < self.timeout:
                continue
            pending = self.runner.pending() or ["(none: checking results)"]
            sys.stderr.write(
                f"\nsoak: rank {self.rank}: step {self.step} has not finished "
                f"after {self.timeout:.0f} s (a hang?). Still pending on this "
                "rank:\n  " + "\n  ".join(pending) + "\naborting the job.\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(3)

    def close(self):
        self._stop.set()
        self._thread.join()


class Coverage:
    """What the plan exercised (the same on every rank)."""

    def __init__(self):
        self.items = collections.Counter()
        self.apis = collections.Counter()
        self.kinds = collections.Counter()
        self.dtypes = collections.Counter()
        self.ops = collections.Counter()
        self.other = collections.Counter()

    def add(self, step):
        for item in step.items:
            self.items[f"{item.mode}, {item.lane} lane"] += 1
            for call in item.calls:
                t = call.template
                self.apis[t.api] += 1
                if t.cold:
                    self.other["cold-name calls"] += 1
                if t.name is None:
                    self.other["unnamed calls"] += 1
                for use in call.uses:
                    c = use.collective
                    self.kinds[c.kind] += 1
                    self.dtypes[c.dtype] += 1
                    if c.op:
                        self.ops[f"{c.kind} {c.op}"] += 1
                    if c.prescale != 1 or c.postscale != 1:
                        self.other["scaled reductions"] += 1
                    if any(0 in s for s in use.shapes):
                        self.other["zero-size tensors"] += 1
                    if any(len(s) == 0 for s in use.shapes):
                        self.other["scalars"] += 1
                    if use.shapes[0] == (plan.BIG_ELEMENTS,):
                        self.other[f"big tensors ({plan.BIG_ELEMENTS} "
                                   "elements)"] += 1
                    if c.kind == "broadcast":
                        self.other[f"broadcast root {use.root}"] += 1
                    if c.kind == "alltoall":
                        self.other["alltoall " + (
                            "even" if use.splits is None else
                            "with splits")] += 1

    def as_dict(self, the_plan):
        cold = the_plan.cold_first_lap_step
        return {
            "items": dict(sorted(self.items.items())),
            "calls by API": dict(sorted(self.apis.items())),
            "tensors by kind": dict(sorted(self.kinds.items())),
            "tensors by dtype": dict(sorted(self.dtypes.items())),
            "reductions by op": dict(sorted(self.ops.items())),
            "other": dict(sorted(self.other.items())),
            "cold names": (
                f"pool of {the_plan.cold_pool_size} (response cache "
                f"capacity + {plan.COLD_POOL_MARGIN}); "
                + (f"each used once by step {cold}, renegotiated after that"
                   if cold is not None else "first lap not completed")),
        }


class Results:
    """This rank's result checks: counts and the failures, printed at once."""

    def __init__(self, rank, size, seed, corrupt_step):
        self.rank, self.size, self.seed = rank, size, seed
        self.corrupt_step = corrupt_step  # None unless self-testing
        self.tensors = self.outputs = self.inputs = 0
        self.mismatches = self.errors = 0
        self.failures = []

    def _fail(self, text):
        self.failures.append(text)
        if len(self.failures) <= PRINTED_FAILURES_PER_RANK:
            sys.stderr.write(f"soak: {text}\n")
            sys.stderr.flush()

    def _where(self, step, item, call, member):
        return (f"step {step.index}, rank {self.rank}, "
                f"{calls.describe_item(item).split(':')[0]}, call "
                f"{call}: {calls.describe_call(item.calls[call].template)}, "
                f"member {member}")

    def check_step(self, step, inputs, outputs):
        for item, item_inputs, item_outputs in zip(step.items, inputs,
                                                   outputs):
            if isinstance(item_outputs, Exception):
                self.errors += 1
                self._fail(f"ERROR step {step.index}, rank {self.rank}, "
                           f"{calls.describe_item(item)}: "
                           f"{type(item_outputs).__name__}: "
                           f"{str(item_outputs).strip()[:2000]}")
                continue
            for c, call in enumerate(item.calls):
                call_outputs = item_outputs[c] if c < len(item_outputs) \
                    else []
                if len(call_outputs) != len(call.uses):
                    self.mismatches += 1
                    self._fail(f"MISMATCH {self._where(step, item, c, 0)}: "
                               f"{len(call_outputs)} tensors returned, "
                               f"expected {len(call.uses)}")
                for m, (use, got) in enumerate(zip(call.uses, call_outputs)):
                    self._check_tensor(step, item, c, m, use, got,
                                       item_inputs[c][m])

    def _check_tensor(self, step, item, c, m, use, got, own_input):
        every_input = [plan.rank_input(self.seed, use, r, self.size)
                       for r in range(self.size)]
        expected = reference.expected_outputs(use, every_input, self.rank,
                                              self.size)
        dtypes = [plan.np_dtype(use.collective.dtype), np.dtype(np.int32)]
        self.tensors += 1
        for o, (want, tensor) in enumerate(zip(expected, got)):
            if (self.corrupt_step is not None and step.index >=
                    self.corrupt_step and want.values.size):
                want, self.corrupt_step = want.corrupt(), None
            self.outputs += 1
            problem = reference.mismatch(tensor.numpy(), want, dtypes[o])
            if problem:
                self.mismatches += 1
                self._fail(f"MISMATCH {self._where(step, item, c, m)}, "
                           f"output {o}, dtype {use.collective.dtype}, "
                           f"shapes per rank {list(use.shapes)}: {problem}")
        if len(expected) != len(got):
            self.mismatches += 1
            self._fail(f"MISMATCH {self._where(step, item, c, m)}: "
                       f"{len(got)} outputs, expected {len(expected)}")
        if item.program is None:
            # Eager inputs are the caller's tensors: tfring must not write
            # into them.
            self.inputs += 1
            if not np.array_equal(own_input.numpy(),
                                  every_input[self.rank]):
                self.mismatches += 1
                self._fail(f"MISMATCH {self._where(step, item, c, m)}: the "
                           "input tensor changed during the collective")


def step_inputs(seed, step, rank, size):
    """This rank's input tensors for `step`: per item, per call, per
    member."""
    return [[[tf.constant(plan.rank_input(seed, use, rank, size))
              for use in call.uses] for call in item.calls]
            for item in step.items]


class PlantedLeaks:
    """The self-tests' deliberate leaks, planted after the warm-up so the
    memory, thread and fd checks must fail."""

    def __init__(self, chosen, args):
        self.chosen = chosen
        steps_after = args.steps - args.warmup_steps
        self.chunk_bytes = int((args.max_growth_mib + 16) * resources.MIB
                               / max(1, steps_after)) + 1
        self.hoard = []
        self.release = threading.Event()
        self.thread = None
        self.fd = None

    def after_step(self, step_index, warmup_steps):
        if step_index < warmup_steps:
            return
        if "leak-memory" in self.chosen:
            self.hoard.append(np.ones(self.chunk_bytes, np.uint8))
        if "leak-thread" in self.chosen and self.thread is None:
            self.thread = threading.Thread(target=self.release.wait,
                                           daemon=True)
            self.thread.start()
        if "leak-fd" in self.chosen and self.fd is None:
            self.fd = os.open(os.devnull, os.O_RDONLY)

    def clean_up(self):
        self.hoard.clear()
        self.release.set()
        if self.thread is not None:
            self.thread.join()
        if self.fd is not None:
            os.close(self.fd)


def header_lines(size, shm):
    mpi = MPI.Get_library_version().split(",")[0].strip()
    return [
        "tfring soak: random mixed collectives, every result checked",
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
        "UTC",
        f"machine: {socket.gethostname()}, {os.cpu_count()} cores, "
        f"{platform.machine()}, Linux {platform.release()}; "
        f"TensorFlow {tf.__version__}, {mpi}, Python "
        f"{platform.python_version()}",
        f"tfring: {size} ranks, shared memory {'on' if shm else 'off'} "
        f"(TFRING_SHM={os.environ.get('TFRING_SHM', '1 (default)')}), "
        f"response cache capacity {config_value('TFRING_CACHE_CAPACITY')}",
    ]


def main():
    args = parse_args()
    # TensorFlow warns each time a program or grouped call is traced again
    # for new shapes; the traces are bounded (shapes relax to unknown
    # dimensions) and expected here.
    tf.get_logger().setLevel(logging.ERROR)
    if args.intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads)
    comm = MPI.COMM_WORLD
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    started = time.perf_counter()

    the_plan = plan.Plan(args.seed, size,
                         int(config_value("TFRING_CACHE_CAPACITY")))
    programs = {t.name: calls.build_program(t, i, args.seed, rank)
                for i, t in enumerate(the_plan.programs)}
    runner = calls.StepRunner(args.seed, rank, programs)
    watchdog = Watchdog(args.step_timeout, rank, runner)
    corrupt_step = (args.steps // 2 if "corrupt-reference" in args.self_test
                    and rank == size - 1 else None)
    results = Results(rank, size, args.seed, corrupt_step)
    leaks = PlantedLeaks(args.self_test, args)
    coverage = Coverage()

    samples = [resources.sample(0)]
    start_sample = warmup_sample = samples[0]
    step_seconds, check_seconds = [], 0.0
    for index in range(args.steps):
        watchdog.begin(index)
        step = the_plan.step(index)
        coverage.add(step)
        inputs = step_inputs(args.seed, step, rank, size)
        began = time.perf_counter()
        outputs = runner.run(step, inputs)
        step_seconds.append(time.perf_counter() - began)
        began = time.perf_counter()
        results.check_step(step, inputs, outputs)
        check_seconds += time.perf_counter() - began
        del inputs, outputs
        watchdog.end()
        leaks.after_step(index, args.warmup_steps)
        done = index + 1
        if done % args.sample_every == 0 or done in (args.warmup_steps,
                                                     args.steps):
            samples.append(resources.sample(done))
            if done == args.warmup_steps:
                warmup_sample = samples[-1]
    end_sample = samples[-1]
    loop_seconds = time.perf_counter() - started

    figures = {
        "rank": rank, "samples": samples, "start": start_sample,
        "warmup": warmup_sample, "end": end_sample,
        "step_seconds": step_seconds, "check_seconds": check_seconds,
        "tensors_checked": results.tensors,
        "outputs_checked": results.outputs,
        "inputs_checked": results.inputs, "mismatches": results.mismatches,
        "errors": results.errors, "failures": results.failures[:50],
        "steps_done": len(step_seconds),
    }
    every_rank = comm.gather(figures, root=0)
    passed = None
    if rank == 0:
        settings = {"steps": args.steps, "seed": args.seed, "size": size,
                    "warmup_steps": args.warmup_steps,
                    "sample_every": args.sample_every,
                    "window_steps": args.window_steps,
                    "max_growth_mib": args.max_growth_mib,
                    "shm_enabled": bool(hvd.shm_enabled()),
                    "self_test": sorted(args.self_test)}
        result = report.evaluate(every_rank, settings)
        header = header_lines(size, hvd.shm_enabled())
        covered = coverage.as_dict(the_plan)
        wall_seconds = time.perf_counter() - PROCESS_STARTED
        print(report.format_text(result, header, covered, wall_seconds,
                                 loop_seconds), flush=True)
        if args.json:
            result.update(header=header, coverage=covered,
                          wall_seconds=round(wall_seconds, 1),
                          loop_seconds=round(loop_seconds, 1),
                          samples={r["rank"]: r["samples"]
                                   for r in every_rank})
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        passed = result["passed"]
    passed = comm.bcast(passed, root=0)
    leaks.clean_up()
    watchdog.close()
    runner.close()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
