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
  mwms-shipped  as mwms, without the patches below (shows the failure).

The modes run in rounds, interleaved (the order rotates every round), so a
change in the machine's load hits every mode alike. Each process times the
steps after the warm-up steps (tracing, the initial broadcast) and reports
its img/s; a 2-process mode's rate is the sum of its two processes. The report
gives every round, the median, and each 2-process mode as a fraction of the
ceiling measured in the same round (median over rounds).

MultiWorkerMirroredStrategy and Keras 3: `model.fit` under MWMS with 2 workers
fails as shipped (keras-team/keras#20585). Two places in
keras/src/backend/tensorflow/trainer.py assume a single worker; the mwms
worker below patches both in its own process (see _patch_keras_for_mwms),
and the report says so:
  1. TensorFlowTrainer._maybe_symbolic_build passes the whole first batch,
     a tuple of PerReplica values, to strategy.reduce("MEAN", ...), which
     accepts one value, so fit dies with "Attempt to convert a value
     (PerReplica...) to a Tensor". The batch only supplies shapes for
     building the model and optimizer, so the patch takes this worker's
     local value of each element instead (no communication).
  2. reduce_per_replica, with several workers, averages every step's logs
     with strategy.reduce("MEAN", v, axis=0), which fails on the scalar loss
     ("Invalid reduction dimension 0 for input with 0 dimensions"). The
     patch uses axis=None, the cross-worker mean of the scalars that Keras
     intends (still one small collective per step, as shipped).

The worker side is this same file run with --worker MODE.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.abspath(__file__)
TAG_VARIABLE = "KERAS_SCALING_TAG"
RESULT_PREFIX = "SCALING_RESULT "

MODES = {
    "ceiling": "2 independent processes (ceiling)",
    "tfring": "tfring, 2 ranks",
    # Not run by default: tfring with Open MPI told to yield the CPU while
    # it waits (OMPI_MCA_mpi_yield_when_idle=1). With as many ranks as cores,
    # MPI's busy polling otherwise takes CPU time from TensorFlow.
    "tfring-yield": "tfring, 2 ranks, MPI yields when idle",
    "mwms": "MultiWorkerMirroredStrategy, 2 workers",
    # Not run by default: MWMS without the patches, to show the failure.
    "mwms-shipped": "MWMS, 2 workers, Keras as shipped",
    "single": "1 process (default threads)",
}
DEFAULT_MODES = ("ceiling", "tfring", "mwms", "single")
TWO_PROCESS_MODES = ("tfring", "tfring-yield", "mwms", "mwms-shipped")

MWMS_PATCH_NOTE = (
    "MWMS runs with two patches to Keras 3.x's TF trainer, applied inside the "
    "benchmark's worker (keras-team/keras#20585): _maybe_symbolic_build takes "
    "each worker's local first batch instead of strategy.reduce() of a tuple "
    "of PerReplica values, and reduce_per_replica averages the scalar logs "
    "across workers with axis=None instead of axis=0.")


# ---------------------------------------------------------------- worker --

def _build_model(keras, image_size):
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


def _patch_keras_for_mwms(tf):
    """Makes Keras 3's model.fit run under MultiWorkerMirroredStrategy with
    several workers (keras-team/keras#20585); see the module docstring."""
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        strategy = self.distribute_strategy

        def local_value(value):
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        if iterator is not None:
            for _, _, it in iterator:
                data_batch = tree.map_structure(local_value, next(it))
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    shipped_reduce_per_replica = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if (reduction in ("auto", "mean")
                and tf_trainer._collective_all_reduce_multi_worker(strategy)):
            return tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return shipped_reduce_per_replica(values, strategy, reduction)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = maybe_symbolic_build
    tf_trainer.reduce_per_replica = reduce_per_replica


def _wait_for_peers(directory, index, count, timeout=120.0):
    """A file barrier: returns once `count` processes have called it."""
    open(os.path.join(directory, f"ready.{index}"), "w").close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(directory, f"ready.{i}"))
               for i in range(count)):
            return
        time.sleep(0.005)
    raise RuntimeError(f"the other processes did not reach the start "
                       f"within {timeout:.0f} s")


def run_worker(args):
    import tensorflow as tf

    if args.intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads)
    strategy = None
    if args.worker in ("mwms", "mwms-shipped"):
        # Before any other TensorFlow op: the strategy configures the
        # runtime's collectives from TF_CONFIG.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    hvd = None
    if args.worker == "tfring":
        import tfring as hvd
        import tfring.keras  # noqa: F401  (hvd.keras.callbacks)
        hvd.init()
        process = hvd.rank()
    elif strategy is not None:
        if args.worker == "mwms":
            _patch_keras_for_mwms(tf)
        process = strategy.cluster_resolver.task_id
    else:
        process = args.process
    keras.utils.set_random_seed(process)

    def compile_model():
        model = _build_model(keras, args.image_size)
        optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
        if hvd is not None:
            optimizer = hvd.DistributedOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss=keras.losses.
                      SparseCategoricalCrossentropy(from_logits=True))
        return model

    if strategy is not None:
        with strategy.scope():
            model = compile_model()
    else:
        model = compile_model()

    workers = strategy.num_replicas_in_sync if strategy is not None else 1
    # Under MWMS fit() splits a global batch between the workers: 2 x 32.
    batch = args.batch_size * workers
    images = tf.random.uniform(
        (batch, args.image_size, args.image_size, 3))
    labels = tf.random.uniform((batch,), maxval=10, dtype=tf.int64)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    if strategy is not None:
        # Synthetic data: nothing to shard by file; each worker takes its
        # half of every global batch.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
        dataset = dataset.with_options(options)

    class StepTimer(keras.callbacks.Callback):
        """Times the steps after the first `skip`. Independent processes
        (the ceiling) wait for each other after those, so that their timed
        windows coincide; the 2-process modes are in step anyway."""

        def __init__(self, skip):
            super().__init__()
            self.skip, self.done, self.timed = skip, 0, 0
            self.start = self.end = self.wall_start = self.wall_end = None

        def on_train_batch_end(self, batch, logs=None):
            self.done += 1
            if self.done == self.skip and args.barrier_dir:
                _wait_for_peers(args.barrier_dir, process,
                                args.barrier_count)
            now = time.perf_counter()
            if self.done == self.skip:
                self.start, self.wall_start = now, time.time()
            elif self.done > self.skip:
                self.timed += 1
                self.end, self.wall_end = now, time.time()

    timer = StepTimer(args.warmup_steps)
    callbacks = [timer]
    if hvd is not None:
        callbacks.insert(
            0, hvd.keras.callbacks.BroadcastGlobalVariablesCallback(0))
    model.fit(dataset, epochs=1, shuffle=False,
              steps_per_epoch=args.warmup_steps + args.steps,
              callbacks=callbacks, verbose=0)
    seconds = timer.end - timer.start
    result = {"mode": args.worker, "process": process,
              "img_per_sec": args.batch_size * timer.timed / seconds,
              "steps": timer.timed, "seconds": seconds,
              "wall_start": timer.wall_start, "wall_end": timer.wall_end}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# ---------------------------------------------------------- orchestrator --

def _tagged_pids(tag):
    needle = f"{TAG_VARIABLE}={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _kill_tagged(tag):
    """Ends every process this run started (mpirun puts ranks in their own
    process groups, so the environment tag is what finds them all)."""
    for _ in range(3):
        pids = _tagged_pids(tag)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def _free_ports(count):
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("localhost", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _worker_command(args, mode, extra=()):
    command = [sys.executable, SCRIPT, "--worker", mode,
               "--steps", str(args.steps),
               "--warmup-steps", str(args.warmup_steps),
               "--batch-size", str(args.batch_size),
               "--image-size", str(args.image_size)]
    return command + list(extra)


def _commands(args, mode, barrier_dir):
    """(command, extra environment) for each process to start."""
    if mode in ("tfring", "tfring-yield"):
        command = [sys.executable, "-m", "tfring.runner", "-np", "2"]
        extra_env = ({"OMPI_MCA_mpi_yield_when_idle": "1"}
                     if mode == "tfring-yield" else {})
        return [(command + _worker_command(
            args, "tfring", ["--intra-op-threads", "1"]), extra_env)]
    if mode == "ceiling":
        return [(_worker_command(args, "ceiling", [
            "--intra-op-threads", "1", "--process", str(i),
            "--barrier-dir", barrier_dir, "--barrier-count", "2"]), {})
            for i in range(2)]
    if mode in ("mwms", "mwms-shipped"):
        ports = _free_ports(2)
        cluster = {"worker": [f"localhost:{p}" for p in ports]}
        return [(_worker_command(args, mode, ["--intra-op-threads", "1"]),
                 {"TF_CONFIG": json.dumps(
                     {"cluster": cluster,
                      "task": {"type": "worker", "index": i}})})
                for i in range(2)]
    return [(_worker_command(args, "single", ["--intra-op-threads", "0"]),
             {})]


def _failure_reason(output):
    """The last error line of a failed run (and, when the error message
    quotes a long value, the line that ends the message)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if "Error" in line or "error:" in line:
            if line.endswith(("{", "(", "[")):
                ends = [later for later in lines[index + 1:]
                        if later.startswith(("}", ")", "]"))]
                if ends:
                    line = f"{line} ... {ends[0]}"
            return line[:400]
    return lines[-1][:400] if lines else "no output"


def run_mode(args, mode):
    """Runs one mode once; returns (total img/s, detail dict) or
    (None, reason)."""
    tag = uuid.uuid4().hex
    env = dict(os.environ)
    env[TAG_VARIABLE] = tag
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The working tree's tfring, after anything the caller put first.
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in [env.get("PYTHONPATH")] if p] + [REPO])
    expected = 1 if mode == "single" else 2
    with tempfile.TemporaryDirectory(prefix="tfring_scaling_") as barrier:
        processes = []
        for command, extra in _commands(args, mode, barrier):
            processes.append(subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=dict(env, **extra), cwd=REPO, text=True,
                errors="replace", start_new_session=True))
        deadline = time.monotonic() + args.timeout
        outputs, timed_out = [], False
        for process in processes:
            try:
                out, _ = process.communicate(
                    timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_tagged(tag)
                out, _ = process.communicate()
            outputs.append(out or "")
        _kill_tagged(tag)
    output = "\n".join(outputs)
    results = [json.loads(line[len(RESULT_PREFIX):])
               for line in output.splitlines()
               if line.startswith(RESULT_PREFIX)]
    if timed_out:
        return None, f"timed out after {args.timeout:.0f} s"
    failed = [p.returncode for p in processes if p.returncode != 0]
    if failed or len(results) != expected:
        if args.show_failures:
            sys.stderr.write(f"----- {mode} output -----\n{output[-6000:]}\n")
        return None, (f"exit codes {[p.returncode for p in processes]}, "
                      f"{len(results)}/{expected} results: "
                      f"{_failure_reason(output)}")
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
    if "single" in rates and summary["single"][1] is not None:
        print(f"{MODES['single']}: {summary['single'][1]:.2f} of the ceiling"
              f" (for scale)")
    if "mwms" in rates:
        print(MWMS_PATCH_NOTE)


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
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
