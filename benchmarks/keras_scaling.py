"""How close tfring's model.fit at 2 ranks comes to what this machine can do.

    python benchmarks/keras_scaling.py                 # about 2-3 minutes
    python benchmarks/keras_scaling.py --repeats 1 --steps 100   # quicker
    python benchmarks/keras_scaling.py --image-size 96 --steps 100 \
        --warmup-steps 10 --repeats 2     # 9x the work per image, ~3 min

One invocation trains the same small CNN (the one of
keras_examples/keras_synthetic_benchmark.py: synthetic 32x32x3 images by
default, batch 32 per process, SGD with momentum) with keras `model.fit` in
several ways, each in fresh processes started from here:

  ceiling  two independent single processes started together, one intra-op
           thread each, no communication: the most two processes can do on
           this machine (the "no-communication ceiling"). They wait for
           each other after the warm-up steps, so their timed windows
           coincide.
  tfring   tfring at 2 ranks (tfringrun, one intra-op thread per rank):
           DistributedOptimizer averages the gradients every step.
  mwms     tf.distribute.MultiWorkerMirroredStrategy with 2 workers on
           localhost (TF_CONFIG, gRPC, one intra-op thread per worker).
  single   one process alone with TensorFlow's default threads.

and, only when named in --modes:

  tfring-yield  as tfring, with OMPI_MCA_mpi_yield_when_idle=1 (Open MPI
                yields the CPU instead of busy polling while it waits).
  tfring-bound  as tfring, with TFRING_CPU_BINDING=1 (each rank bound to its
                own share of the CPUs, as the ceiling's processes are).
  tfring-timeline  as tfring, with TFRING_TIMELINE recording every step (the
                timeline's cost: compare with tfring in the same rounds).
  tfring-autotune  as tfring, with TFRING_AUTOTUNE=1 and a short search
                (AUTOTUNE_ENV below; about 150 cycles, one or two per step):
                give it --warmup-steps 250 so the search ends before the
                timed steps. Its log goes to AUTOTUNE_LOG.
  mwms-shipped  as mwms, without the patches (shows the failure).

The modes run in rounds, interleaved (the order rotates every round), so a
change in the machine's load hits every mode alike. Each process times the
steps after the warm-up steps (tracing, the initial broadcast) and reports
its img/s; a 2-process mode's rate is the sum of its two processes. The report
gives every round, the median, and each 2-process mode as a fraction of the
ceiling measured in the same round (median over rounds).

MultiWorkerMirroredStrategy and Keras 3: `model.fit` under MWMS with 2 workers
fails as shipped (keras-team/keras#20585). The mwms worker patches two places
of Keras' TF trainer in its own process (see
_keras_workers.patch_keras_for_mwms, which explains both), and the report
says so.

The worker side is this same file run with --worker MODE.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

# Helpers next to this script (its directory is first on sys.path).
import _keras_workers as kw

SCRIPT = os.path.abspath(__file__)

MODES = {
    "ceiling": "2 independent processes (ceiling)",
    "tfring": "tfring, 2 ranks",
    # Not run by default: tfring with Open MPI told to yield the CPU while
    # it waits (OMPI_MCA_mpi_yield_when_idle=1). With as many ranks as cores,
    # MPI's busy polling otherwise takes CPU time from TensorFlow.
    "tfring-yield": "tfring, 2 ranks, MPI yields when idle",
    "tfring-timeline": "tfring, 2 ranks, timeline recording",
    # Not run by default: tfring with each rank bound to its CPU share.
    "tfring-bound": "tfring, 2 ranks, TFRING_CPU_BINDING=1",
    "tfring-autotune": "tfring, 2 ranks, TFRING_AUTOTUNE=1",
    "mwms": "MultiWorkerMirroredStrategy, 2 workers",
    # Not run by default: MWMS without the patches, to show the failure.
    "mwms-shipped": "MWMS, 2 workers, Keras as shipped",
    "single": "1 process (default threads)",
}
DEFAULT_MODES = ("ceiling", "tfring", "mwms", "single")
TFRING_MODES = ("tfring", "tfring-yield", "tfring-timeline", "tfring-autotune",
                "tfring-bound")
TWO_PROCESS_MODES = TFRING_MODES + ("mwms", "mwms-shipped")
AUTOTUNE_LOG = os.path.join(tempfile.gettempdir(), "tfring_keras_scaling_autotune.csv")
AUTOTUNE_ENV = {
    "TFRING_AUTOTUNE": "1",
    "TFRING_AUTOTUNE_LOG": AUTOTUNE_LOG,
    "TFRING_AUTOTUNE_WARMUP_SAMPLES": "2",
    "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE": "4",
    "TFRING_AUTOTUNE_SAMPLES_PER_TRIAL": "2",
    "TFRING_AUTOTUNE_MAX_TRIALS": "12",
}


# ---------------------------------------------------------------- worker --

def run_worker(args):
    kw.train_and_report(
        args.worker, model_name="cnn", image_size=args.image_size,
        batch_size=args.batch_size, warmup_steps=args.warmup_steps,
        steps=args.steps, intra_op_threads=args.intra_op_threads,
        process=args.process, barrier_dir=args.barrier_dir,
        barrier_count=args.barrier_count)


# ---------------------------------------------------------- orchestrator --

def _worker_command(args, mode, extra=()):
    command = [sys.executable, SCRIPT, "--worker", mode,
               "--steps", str(args.steps),
               "--warmup-steps", str(args.warmup_steps),
               "--batch-size", str(args.batch_size),
               "--image-size", str(args.image_size)]
    return command + list(extra)


def _launches(args, mode, barrier_dir):
    """The processes (kw.Launch) of one run of `mode`."""
    if mode in TFRING_MODES:
        command = [sys.executable, "-m", "tfring.launcher.cli", "-np", "2"]
        extra_env = {
            "tfring": {},
            "tfring-yield": {"OMPI_MCA_mpi_yield_when_idle": "1"},
            "tfring-bound": {"TFRING_CPU_BINDING": "1"},
            "tfring-timeline": {"TFRING_TIMELINE": os.path.join(barrier_dir,
                                                                "timeline.json")},
            "tfring-autotune": AUTOTUNE_ENV,
        }[mode]
        return [kw.Launch(command + _worker_command(
            args, "tfring", ["--intra-op-threads", "1"]), extra_env)]
    if mode == "ceiling":
        return [kw.Launch(_worker_command(args, "ceiling", [
            "--intra-op-threads", "1", "--process", str(i),
            "--barrier-dir", barrier_dir, "--barrier-count", "2"]))
            for i in range(2)]
    if mode in ("mwms", "mwms-shipped"):
        cluster = kw.localhost_cluster(worker=2)
        return [kw.Launch(
            _worker_command(args, mode, ["--intra-op-threads", "1"]),
            {"TF_CONFIG": kw.tf_config(cluster, "worker", i)})
            for i in range(2)]
    return [kw.Launch(
        _worker_command(args, "single", ["--intra-op-threads", "0"]))]


def run_mode(args, mode):
    """Runs one mode once; returns (total img/s, detail dict) or
    (None, reason)."""
    expected = 1 if mode == "single" else 2
    with tempfile.TemporaryDirectory(prefix="tfring_scaling_") as barrier:
        group = kw.run_processes(_launches(args, mode, barrier),
                                 args.timeout)
    failure = kw.describe_failure(group, expected, args.timeout)
    if failure is not None:
        if args.show_failures and group.outcome != "timed out":
            output = "\n".join(group.outputs)
            sys.stderr.write(f"----- {mode} output -----\n{output[-6000:]}\n")
        return None, failure
    results = group.results
    total = sum(r["img_per_sec"] for r in results)
    starts = [r["wall_start"] for r in results]
    ends = [r["wall_end"] for r in results]
    overlap = ((min(ends) - max(starts)) / (max(ends) - min(starts))
               if expected > 1 else 1.0)
    return total, {"per_process": [r["img_per_sec"] for r in results],
                   "overlap": overlap}


def orchestrate(args):
    modes = args.modes
    order_note = ", ".join(modes)
    print(f"keras_scaling: small CNN on {args.image_size}x{args.image_size} "
          f"images, batch {args.batch_size} per process, "
          f"{args.warmup_steps} warm-up + {args.steps} timed steps, "
          f"{args.repeats} round(s) of [{order_note}] (order rotates), "
          f"{os.cpu_count()} CPUs", flush=True)
    rates = {m: [] for m in modes}       # per round: img/s or None
    reasons = {m: [] for m in modes}
    started = time.monotonic()
    for round_index in range(args.repeats):
        shift = round_index % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            t0 = time.monotonic()
            total, detail = run_mode(args, mode)
            took = time.monotonic() - t0
            if total is None:
                rates[mode].append(None)
                reasons[mode].append(detail)
                print(f"  round {round_index + 1} {mode:12s} FAILED "
                      f"({took:.0f} s): {detail}", flush=True)
                continue
            rates[mode].append(total)
            per = " + ".join(f"{r:.0f}" for r in detail["per_process"])
            note = ("" if detail["overlap"] >= 0.95 else
                    f"  (timed windows overlap only "
                    f"{detail['overlap']:.0%})")
            print(f"  round {round_index + 1} {mode:12s} {total:8.1f} img/s "
                  f"= {per} ({took:.0f} s){note}", flush=True)
    report(args, rates, reasons, time.monotonic() - started)


def report(args, rates, reasons, seconds):
    print(f"\nResults (img/s, total over the processes of a mode; "
          f"{seconds:.0f} s in all):")
    header = "".join(f"  round {i + 1:<3d}" for i in range(args.repeats))
    print(f"  {'mode':40s}{header}    median  / ceiling")
    ceiling = rates.get("ceiling", [])
    summary = {}
    for mode in [m for m in MODES if m in rates]:
        values = rates[mode]
        cells = "".join(f"  {v:9.1f}" if v is not None else f"  {'failed':>9s}"
                        for v in values)
        ok = [v for v in values if v is not None]
        median = statistics.median(ok) if ok else None
        fractions = [v / c for v, c in zip(values, ceiling)
                     if v is not None and c]
        fraction = statistics.median(fractions) if fractions else None
        if mode == "ceiling":
            fraction_text = "1.00" if ok else "-"
        else:
            fraction_text = f"{fraction:.2f}" if fraction is not None else "-"
        median_text = f"{median:9.1f}" if median is not None else "   failed"
        print(f"  {MODES[mode]:40s}{cells}  {median_text}  {fraction_text}")
        summary[mode] = (median, fraction, fractions)
    print()
    for mode in TWO_PROCESS_MODES:
        if mode not in rates:
            continue
        median, fraction, fractions = summary[mode]
        if fraction is None:
            why = "; ".join(sorted(set(reasons[mode]))) or "no ceiling"
            print(f"{MODES[mode]}: no result ({why})")
            continue
        spread = (f"{min(fractions):.2f}-{max(fractions):.2f}"
                  if len(fractions) > 1 else f"{fractions[0]:.2f}")
        target = " (target >= 0.90)" if mode == "tfring" else ""
        print(f"{MODES[mode]}: {fraction:.2f} of the ceiling "
              f"(rounds: {spread}){target}")
        if reasons[mode]:
            print(f"  some rounds failed: "
                  f"{'; '.join(sorted(set(reasons[mode])))}")
    # The tfring variants against plain tfring in the same rounds.
    for mode in TFRING_MODES[1:]:
        if mode not in rates or "tfring" not in rates:
            continue
        ratios = [v / t for v, t in zip(rates[mode], rates["tfring"]) if v and t]
        if ratios:
            print(f"{MODES[mode]}: {statistics.median(ratios):.3f} of tfring's img/s "
                  f"(median over rounds of the same-round ratio; rounds: "
                  f"{', '.join(f'{r:.3f}' for r in ratios)})")
    if "single" in rates and summary["single"][1] is not None:
        print(f"{MODES['single']}: {summary['single'][1]:.2f} of the ceiling"
              f" (for scale)")
    if "mwms" in rates:
        print(kw.MWMS_PATCH_NOTE)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500,
                        help="timed steps per process and run")
    parser.add_argument("--warmup-steps", type=int, default=20,
                        help="untimed steps first (tracing, broadcast)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per process per step")
    parser.add_argument("--image-size", type=int, default=32,
                        help="image height and width (the work per step "
                             "grows with its square)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds over all modes")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"comma-separated subset of {', '.join(MODES)} "
                             f"(default: {','.join(DEFAULT_MODES)}; "
                             f"mwms-shipped shows Keras' failure under MWMS)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one run of one mode may take")
    parser.add_argument("--show-failures", action="store_true",
                        help="print the output of failed runs")
    # Worker side (set by the orchestrator).
    parser.add_argument("--worker", choices=list(MODES), default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, default=0,
                        help=argparse.SUPPRESS)
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help=argparse.SUPPRESS)
    parser.add_argument("--barrier-dir", default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--barrier-count", type=int, default=1,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            parser.error(f"--modes got {args.modes!r}; expected a "
                         f"comma-separated subset of {', '.join(MODES)}")
        args.modes = modes
    if args.warmup_steps < 1 or args.steps < 1:
        parser.error("--steps and --warmup-steps must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker is not None:
        run_worker(args)
        return
    try:
        orchestrate(args)
    finally:
        kw.kill_all_started()


if __name__ == "__main__":
    main()
