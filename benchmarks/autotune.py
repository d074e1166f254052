"""Does TFRING_AUTOTUNE end at settings at least as fast as the defaults?

    python benchmarks/autotune.py                  # about 5 minutes
    python benchmarks/autotune.py --rounds 1 --measure-steps 20   # quicker

Workload: the gradient reduction of a ResNet-50 training step, i.e. one
grouped allreduce of ResNet-50's 214 trainable-variable shapes (about
100 MB of float32) inside a tf.function, at 2 ranks, step after step.

Each configuration runs in a fresh 2-rank job started from here:

  defaults        the configured defaults, no tuning
  autotune        TFRING_AUTOTUNE=1, starting from the defaults
  bad             a poor fusion setup: TFRING_FUSION_THRESHOLD=65536 and
                  TFRING_DIRECT_THRESHOLD=16777216 (every tensor under
                  16 MiB waits for 64 KiB batches), no tuning
  autotune-bad    TFRING_AUTOTUNE=1 starting from that poor setup
                  (TFRING_AUTOTUNE_START: the start is not fixed)

Every job first runs --tune-steps steps (the autotuner searches during them;
the other configurations run them too, so all are equally warm), then times
--measure-steps steps and reports the median step time. The configurations
run in rounds, interleaved (the order rotates), so a change in the machine's
load hits all alike; the report gives each configuration's median over
rounds and its ratio to `defaults` measured in the same invocation. The
autotuner's CSV log of the last round is kept next to --json (or in /tmp),
and the report shows the values each tuned job settled on.

The worker side is this same file run with --worker.
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BAD_START = {"fusion_threshold": 65536, "direct_threshold": 16 * 1024 * 1024}
# A shorter search than the defaults (3 warm-up samples, 10 cycles per
# sample, 3 samples per trial, 20 trials), so the benchmark fits minutes.
TUNING = {
    "TFRING_AUTOTUNE_WARMUP_SAMPLES": "2",
    "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE": "4",
    "TFRING_AUTOTUNE_SAMPLES_PER_TRIAL": "2",
    "TFRING_AUTOTUNE_MAX_TRIALS": "12",
}


def configurations(log_dir):
    start = ",".join(f"{k}={v}" for k, v in BAD_START.items())
    bad_knobs = {"TFRING_FUSION_THRESHOLD": str(BAD_START["fusion_threshold"]),
                 "TFRING_DIRECT_THRESHOLD": str(BAD_START["direct_threshold"])}
    return {
        "defaults": {},
        "autotune": {"TFRING_AUTOTUNE": "1", **TUNING,
                     "TFRING_AUTOTUNE_LOG": os.path.join(log_dir, "autotune.csv")},
        "bad": bad_knobs,
        "autotune-bad": {"TFRING_AUTOTUNE": "1", **TUNING, "TFRING_AUTOTUNE_START": start,
                         "TFRING_AUTOTUNE_LOG": os.path.join(log_dir, "autotune-bad.csv")},
    }


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tune-steps", type=int, default=220,
                        help="steps before timing (the autotuner searches during them)")
    parser.add_argument("--measure-steps", type=int, default=40)
    parser.add_argument("--configs", default="defaults,autotune,bad,autotune-bad")
    parser.add_argument("--json", help="write every number to this file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


# ---------------------------------------------------------------- worker side

def run_worker(args):
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    import tfring
    sys.path.insert(0, HERE)
    from allreduce import resnet50_shapes

    tfring.init()
    shapes = resnet50_shapes()
    grads = [tf.fill(shape, float(tfring.rank() + 1)) for shape in shapes]
    expected = float(sum(range(1, tfring.size() + 1)))

    @tf.function
    def reduce_step(tensors):
        return tfring.grouped_allreduce(tensors, op=tfring.Sum, name="resnet50_grads")

    for _ in range(args.tune_steps):
        out = reduce_step(grads)
    check = out[-1].numpy()
    if not np.all(check == expected):
        raise SystemExit(f"wrong result on rank {tfring.rank()}: {check.ravel()[:4]}")
    times = []
    for _ in range(args.measure_steps):
        start = time.perf_counter()
        reduce_step(grads)  # returns when every reduction is done
        times.append(time.perf_counter() - start)
    slowest = tfring.allgather_object(statistics.median(times))
    if tfring.rank() == 0:
        print("RESULT " + json.dumps({"median_step_s": max(slowest)}), flush=True)
    tfring.shutdown()


# ---------------------------------------------------------------- launcher side

def run_job(name, extra_env, args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO, **extra_env)
    for knob in ("TFRING_FUSION_THRESHOLD", "TFRING_DIRECT_THRESHOLD", "TFRING_CYCLE_TIME"):
        if knob not in extra_env:
            env.pop(knob, None)
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    command = [mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += [sys.executable, os.path.abspath(__file__), "--worker",
                "--tune-steps", str(args.tune_steps), "--measure-steps",
                str(args.measure_steps)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=args.timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"{name}: no result within {args.timeout:.0f} s:\n"
                         f"{(e.output or '')[-3000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])["median_step_s"]
    raise SystemExit(f"{name} failed (exit {done.returncode}):\n"
                     f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def settled_values(log_path):
    """The final row of an autotuner log, or None if it did not finish."""
    if not os.path.exists(log_path):
        return None
    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    final = [r for r in rows if r["phase"] == "final"]
    if not final:
        return {"finished": False, "trials": len(rows)}
    row = final[-1]
    return {"finished": True, "trials": len(rows) - 1,
            "fusion_threshold": int(row["fusion_threshold"]),
            "direct_threshold": int(row["direct_threshold"]),
            "cycle_time_ms": float(row["cycle_time_ms"])}


def main():
    args = parse_args()
    if args.worker:
        run_worker(args)
        return
    log_dir = os.path.dirname(os.path.abspath(args.json)) if args.json else tempfile.mkdtemp(
        prefix="tfring_autotune_")
    configs = configurations(log_dir)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise SystemExit(f"unknown --configs {unknown}; choose from {list(configs)}")
    step_times = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            seconds = run_job(name, configs[name], args)
            step_times[name].append(seconds)
            print(f"round {r + 1}: {name:14s} {seconds * 1e3:8.2f} ms/step", flush=True)
    report = {"date": time.strftime("%Y-%m-%d"), "step_s": step_times, "settled": {}}
    print("\nResNet-50 gradient set, 2 ranks: median step time over rounds")
    base = statistics.median(step_times["defaults"]) if "defaults" in step_times else None
    print(f"  {'configuration':14s} {'ms/step':>9s} {'vs defaults':>12s}  settled on")
    for name in names:
        median = statistics.median(step_times[name])
        log = configs[name].get("TFRING_AUTOTUNE_LOG")
        settled = settled_values(log) if log else None
        report["settled"][name] = settled
        ratio = f"{base / median:11.2f}x" if base else ""
        note = ""
        if settled and settled.get("finished"):
            note = (f"fusion {settled['fusion_threshold'] / 2**20:.2f} MiB, direct "
                    f"{settled['direct_threshold'] / 2**20:.2f} MiB, cycle "
                    f"{settled['cycle_time_ms']} ms after {settled['trials']} trials")
        elif settled:
            note = f"still searching after {settled['trials']} trials: raise --tune-steps"
        print(f"  {name:14s} {median * 1e3:9.2f} {ratio}  {note}")
    print("  (vs defaults: the defaults' step time divided by this one's; above 1 is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
