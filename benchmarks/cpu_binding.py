"""Training throughput with and without TFRING_CPU_BINDING, alternated.

    python benchmarks/cpu_binding.py                  # 2 and 3 ranks, 3 rounds
    python benchmarks/cpu_binding.py --ranks 2 --rounds 5 --programs mobilenetv2

Runs programs that tune nothing of TensorFlow's threading (its default
thread pools, sized for the whole machine), as users' scripts and Horovod's
examples do, under tfringrun with the ranks left as launched
(TFRING_CPU_BINDING=0, the default) and bound to a share of the CPUs each
(=1). The two settings take turns run by run, so drift of a noisy machine
hits both alike. Each run prints its total images per second; the table
gives the median and range per program, rank count and setting, and the
ratio bound / unbound of the medians (below 1: binding is slower).

Programs (keras_examples/, each with its default thread pools):
  mobilenetv2  keras_synthetic_benchmark.py --model mobilenetv2 --batch-size 8
               (model.fit, the set-up of Horovod's Keras synthetic benchmark)
  keras-cnn    keras_synthetic_benchmark.py (model.fit, a small CNN)
  tf2-cnn      tensorflow2_synthetic_benchmark.py (a custom loop with
               DistributedGradientTape, the same small CNN)
  keras-cnn-1thread  keras_synthetic_benchmark.py --intra-op-threads 1 (pools
               sized to a core each: the case binding was made for)
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "keras_examples")
KERAS = os.path.join(EXAMPLES, "keras_synthetic_benchmark.py")
TF2 = os.path.join(EXAMPLES, "tensorflow2_synthetic_benchmark.py")
PROGRAMS = {
    "mobilenetv2": [KERAS, "--model", "mobilenetv2", "--batch-size", "8",
                    "--steps", "20", "--epochs", "2", "--warmup-steps", "5"],
    "keras-cnn": [KERAS, "--steps", "100", "--epochs", "2",
                  "--warmup-steps", "20"],
    "tf2-cnn": [TF2, "--steps", "150", "--warmup-steps", "20"],
    "keras-cnn-1thread": [KERAS, "--steps", "100", "--epochs", "2",
                          "--warmup-steps", "20", "--intra-op-threads", "1"],
}
SETTINGS = {"unbound": "0", "bound": "1"}
TOTAL = re.compile(r"Total img/sec on \d+ ranks?: ([0-9.]+)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per program, rank count and setting")
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS),
                        choices=list(PROGRAMS))
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before one run is given up")
    return parser.parse_args(argv)


def run_once(program, ranks, binding, timeout):
    """Total images per second of one run, or None (with its output
    printed) when it failed."""
    env = dict(os.environ, TFRING_CPU_BINDING=binding, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    command = [sys.executable, "-m", "tfring.launcher.cli", "-np", str(ranks),
               sys.executable, *PROGRAMS[program]]
    try:
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  {program} at {ranks} ranks did not finish within "
              f"{timeout:.0f} s", flush=True)
        return None
    match = TOTAL.search(done.stdout)
    if done.returncode != 0 or not match:
        print(f"  {program} at {ranks} ranks failed (exit {done.returncode}):\n"
              f"{(done.stdout + done.stderr)[-3000:]}", flush=True)
        return None
    return float(match.group(1))


def main(argv=None):
    args = parse_args(argv)
    results = {}  # (program, ranks, setting) -> [img/s]
    for program in args.programs:
        for ranks in args.ranks:
            for round_index in range(args.rounds):
                # Alternate which setting goes first, round by round.
                order = list(SETTINGS) if round_index % 2 == 0 else list(SETTINGS)[::-1]
                for setting in order:
                    start = time.monotonic()
                    rate = run_once(program, ranks, SETTINGS[setting], args.timeout)
                    print(f"{program:18} {ranks} ranks  {setting:8} "
                          f"{'failed' if rate is None else f'{rate:8.1f} img/s'}"
                          f"  ({time.monotonic() - start:.0f} s)", flush=True)
                    if rate is not None:
                        results.setdefault((program, ranks, setting), []).append(rate)
    print()
    print("| program | ranks | unbound img/s (median, range) | bound img/s "
          "(median, range) | bound / unbound |")
    print("|---|---:|---:|---:|---:|")
    for program in args.programs:
        for ranks in args.ranks:
            cells, medians = [], []
            for setting in SETTINGS:
                rates = results.get((program, ranks, setting), [])
                if not rates:
                    cells.append("failed")
                    continue
                median = statistics.median(rates)
                medians.append(median)
                cells.append(f"{median:.1f} ({min(rates):.1f}-{max(rates):.1f})")
            ratio = f"{medians[1] / medians[0]:.2f}" if len(medians) == 2 else ""
            print(f"| {program} | {ranks} | {cells[0]} | {cells[1]} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
