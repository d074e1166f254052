"""tfring against tf.distribute on the same workloads, side by side.

    python benchmarks/compare.py                    # 10-12 min on 2 cores
    python benchmarks/compare.py --quick            # smoke run, 3-6 min
    python benchmarks/compare.py --json docs/compare.json \\
        --plot docs/compare.png
    python benchmarks/compare.py --quick --cases 4KiB,cnn-fit \\
        --modes mpi,tfring,mwms-auto                # a few rows only

Why: tfring's claim is that data-parallel training through its MPI core
costs less than TensorFlow's own multi-worker strategies. This script puts
numbers on that claim in one invocation, on one machine, with every
contender doing the same job: the same tensors reduced, the same model
trained on the same per-process batch, two processes with one intra-op
thread each. It prints one table (date, machine, command included) with
every time and its ratio to tfring's.

Collectives, 2 processes, float32, summed (op Sum everywhere):
  mpi        raw MPI through mpi4py, the best way there is: an in-place
             Allreduce (MPI.IN_PLACE) of numpy buffers, no copies.
  tfring     tfring.allreduce on an eager tensor; for the gradient set,
             tfring.grouped_allreduce of the eager tensors.
  mwms-ring  tf.distribute.MultiWorkerMirroredStrategy with
             CommunicationOptions(implementation=RING), two workers on
             localhost (TF_CONFIG, free ports): the replica context's
             all_reduce inside strategy.run, in a tf.function.
  mwms-auto  the same with implementation=AUTO.
Cases: one tensor of 4 KiB, 64 KiB, 1 MiB, 4 MiB and 64 MiB
(4KiB ... 64MiB), and the ResNet-50 gradient set (resnet50-grads): the
shapes of every trainable variable of keras.applications.ResNet50
(benchmarks/allreduce.py's set, 214 tensors, ~98 MiB), reduced together in
one call. For it, the mpi row is the faster of one in-place Allreduce per
tensor and one in-place Allreduce of a single buffer holding all of them
(as if the gradients already lived in one buffer; the table says which).

Training (keras model.fit, synthetic data made in the worker, SGD with
momentum, sparse categorical cross-entropy, the same batch per process):
  ceiling    the same 2 processes training without any exchange: the most
             this machine can do (the no-communication ceiling).
  tfring     tfring.keras.DistributedOptimizer at 2 ranks.
  mwms-auto  MultiWorkerMirroredStrategy with its default options (AUTO),
             2 workers, with two Keras 3 workarounds (keras-team/keras#20585;
             benchmarks/_keras_workers.py explains them).
  pss        tf.distribute.experimental.ParameterServerStrategy: one
             parameter server and 2 workers plus the coordinator (chief),
             all on localhost. Keras 3's model.fit does not support PSS
             (keras-team/keras#18624; the coordinator tries fit first and
             the report quotes its error), so this row trains the same
             model, optimizer and loss in the closest equivalent: a custom
             training loop scheduled by tf.distribute.coordinator.
             ClusterCoordinator. Its workers update the variables on the
             parameter server asynchronously, without averaging.
Cases: cnn-fit, the small CNN of keras_examples/keras_synthetic_benchmark.py
(32x32 images, batch 32 per process), and resnet50-fit,
keras.applications.ResNet50(weights=None) sized for a small CPU machine
(32x32 images, 10 classes, batch 16 per process).

Method. Every mode runs in fresh processes started from here: one tfringrun
(mpirun) job for mpi and tfring, plain subprocesses with TF_CONFIG for the
tf.distribute modes; each group has a deadline, and every process started
(mpirun's ranks too) is ended when its group ends or this script stops.
Collectives: after one checked run (the sums must be exact), each job
times its variants with benchmarks/_timing.measure: interleaved repetition
by repetition (mpi and tfring share a job), each after a barrier, two
untimed runs first, a repetition's time being the slower process's; the
MWMS workers run the same function over their own strategy's collectives.
Only the collective call is timed, no copy out. The jobs (mpi + tfring,
mwms-ring, mwms-auto) run one after the other; the table gives medians. Training: the steps after the warm-up steps
(tracing, broadcast) are timed in each process; a mode's img/s is the sum
over its processes, its step time a process's batch divided by its share of
that. The modes of a case run in rounds whose order rotates, and the table
gives the median over rounds. "x tfring" is a row's time divided by
tfring's time for the same case: above 1 means slower than tfring.

The machine's load matters on a small shared machine: the header gives the
load average before and after the run.

Worker processes are this same file run with --worker ROLE.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

# Helpers next to this script (its directory is first on sys.path).
import _keras_workers as kw

SCRIPT = os.path.abspath(__file__)
KIB, MIB = 1024, 1024 * 1024

TENSOR_CASES = {"4KiB": 4 * KIB, "64KiB": 64 * KIB, "1MiB": MIB,
                "4MiB": 4 * MIB, "64MiB": 64 * MIB}
GRADIENT_SET_CASE = "resnet50-grads"
COLLECTIVE_CASES = tuple(TENSOR_CASES) + (GRADIENT_SET_CASE,)
LARGE_COLLECTIVE_CASES = ("64MiB", GRADIENT_SET_CASE)
FIT_CASES = {
    "cnn-fit": {"model": "cnn", "image_size": 32, "batch_size": 32,
                "warmup_steps": 10, "steps": 200, "rounds": 3,
                "quick_warmup_steps": 3, "quick_steps": 20},
    "resnet50-fit": {"model": "resnet50", "image_size": 32, "batch_size": 16,
                     "warmup_steps": 2, "steps": 10, "rounds": 1,
                     "quick_warmup_steps": 1, "quick_steps": 2},
}
CASES = COLLECTIVE_CASES + tuple(FIT_CASES)

COLLECTIVE_MODES = ("mpi", "tfring", "mwms-ring", "mwms-auto")
FIT_MODES = ("ceiling", "tfring", "mwms-auto", "pss")
MODES = ("mpi", "tfring", "mwms-ring", "mwms-auto", "pss", "ceiling")
MODE_NAMES = {
    "mpi": "raw MPI (mpi4py, in place)",
    "tfring": "tfring",
    "mwms-ring": "MWMS, RING",
    "mwms-auto": "MWMS, AUTO",
    "pss": "PSS, 1 ps + 2 workers",
    "ceiling": "no communication (ceiling)",
}
FIT_MODE_NAMES = dict(MODE_NAMES, **{"mwms-auto": "MWMS (AUTO, default)"})

NOTES = {
    "mwms-fit": (
        "MWMS model.fit runs with two workarounds for Keras 3 inside the "
        "worker (benchmarks/_keras_workers.py, patch_keras_for_mwms): Keras "
        "3's TF trainer assumes one worker. keras-team/keras#20585: "
        + kw.MWMS_ISSUE_URL),
    "pss-fit": (
        "PSS: Keras 3's model.fit does not support ParameterServerStrategy "
        "(keras-team/keras#18624: " + kw.PSS_ISSUE_URL + "); {fit_error}. "
        "The row is the closest equivalent: the same model, optimizer, "
        "loss and batch per worker in a custom training loop scheduled by "
        "tf.distribute.coordinator.ClusterCoordinator (1 parameter server, "
        "2 workers, the coordinator: 4 processes). Updates are "
        "asynchronous (each worker's gradients are applied on the "
        "parameter server as they come, not averaged)."),
    "mpi-grads": (
        "raw MPI on the gradient set: {variant}, the faster of one in-place "
        "Allreduce per tensor and one in-place Allreduce of all tensors "
        "held in a single buffer (no copies)."),
}
MPI_GRADIENT_VARIANTS = {
    "mpi per tensor": "one in-place Allreduce per tensor",
    "mpi one buffer": "one in-place Allreduce of a single buffer",
}


# -------------------------------------------------------------- helpers --

def import_timing_without_mpi_init():
    """benchmarks/_timing.py for a process that is no MPI rank: mpi4py is
    told not to initialise MPI when _timing imports it."""
    import mpi4py
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    import _timing
    return _timing


def case_label(case, gradient_set=None):
    if case in TENSOR_CASES:
        timing = import_timing_without_mpi_init()
        return f"allreduce {timing.describe_size(TENSOR_CASES[case])}"
    if case == GRADIENT_SET_CASE:
        if gradient_set:
            return (f"ResNet-50 gradients ({gradient_set['tensors']} "
                    f"tensors, {gradient_set['values'] * 4 / MIB:.0f} MiB)")
        return "ResNet-50 gradients"
    spec = FIT_CASES[case]
    model = "small CNN" if spec["model"] == "cnn" else "ResNet-50"
    return (f"fit {model} {spec['image_size']}x{spec['image_size']}, "
            f"batch {spec['batch_size']}/process")


def gradient_set_shapes():
    """The ResNet-50 gradient set of benchmarks/allreduce.py."""
    import_timing_without_mpi_init()
    import allreduce
    return allreduce.resnet50_shapes()


def shapes_of(case):
    if case == GRADIENT_SET_CASE:
        return gradient_set_shapes()
    return [(TENSOR_CASES[case] // 4,)]


def repeats_for(args, case):
    return (args.large_repeats if case in LARGE_COLLECTIVE_CASES
            else args.repeats)


def describe_gradient_set(shapes):
    return {"tensors": len(shapes),
            "values": int(sum(int(np.prod(s)) for s in shapes))}


# ------------------------------------------------ collectives: workers --

def mpi_gradient_set_variants(comm, hvd, tf, shapes, modes):
    """The gradient set reduced by raw MPI (two in-place ways) and by
    tfring.grouped_allreduce on eager tensors; checks tfring's sums."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    variants = {}
    if "mpi" in modes:
        # Zeros, so that repeated in-place sums stay exact.
        per_tensor = [np.zeros(s, np.float32) for s in shapes]
        one_buffer = np.zeros(sum(int(np.prod(s)) for s in shapes),
                              np.float32)

        def each_tensor():
            for buffer in per_tensor:
                comm.Allreduce(MPI.IN_PLACE, buffer)

        variants["mpi per tensor"] = each_tensor
        variants["mpi one buffer"] = (
            lambda: comm.Allreduce(MPI.IN_PLACE, one_buffer))
    if "tfring" in modes:
        tensors = [tf.constant(np.full(s, rank + 1, np.float32))
                   for s in shapes]
        sums = hvd.grouped_allreduce(tensors, op=hvd.Sum)
        check_sums("tfring.grouped_allreduce", sums, size)
        variants["tfring"] = lambda: hvd.grouped_allreduce(tensors,
                                                           op=hvd.Sum)
    return variants


def check_sums(what, results, size):
    """Every value of every result must be 1 + 2 + ... + size (each
    process contributed its rank + 1)."""
    expected = size * (size + 1) / 2
    for result in results if isinstance(results, (list, tuple)) \
            else [results]:
        values = np.asarray(result)
        if not np.all(values == expected):
            raise AssertionError(
                f"{what}: wrong sum, got {values.ravel()[:4]}..., expected "
                f"{expected}")


def run_mpi_collectives(args):
    """A rank of the tfringrun job timing raw MPI and tfring together."""
    from mpi4py import MPI  # initialises MPI; tfring joins
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import tfring as hvd
    import allreduce  # benchmarks/allreduce.py: its cases and data
    from _timing import measure

    hvd.init()
    comm = MPI.COMM_WORLD
    modes = args.modes
    results, gradient_set = {}, None
    for case in args.cases:
        if case == GRADIENT_SET_CASE:
            shapes = allreduce.resnet50_shapes()
            gradient_set = describe_gradient_set(shapes)
            variants = mpi_gradient_set_variants(comm, hvd, tf, shapes,
                                                 modes)
        else:
            # allreduce.py's variants (checked there) include these two.
            every = allreduce.single_tensor_variants(comm,
                                                     TENSOR_CASES[case])
            variants = {}
            if "mpi" in modes:
                variants["mpi"] = every["mpi4py Allreduce in place"]
            if "tfring" in modes:
                variants["tfring"] = every["tfring allreduce eager"]
        times = measure(comm, variants, repeats_for(args, case))
        results[case] = {label: [float(t) for t in samples]
                         for label, samples in times.items()}
        del variants
    if comm.Get_rank() == 0:
        kw.report({"job": "mpi", "cases": results,
                   "gradient_set": gradient_set,
                   "mpi_library": MPI.Get_library_version().split(",")[0]
                   .strip()})
    comm.Barrier()


class StrategyComm:
    """The two calls _timing.measure makes on an MPI communicator, Barrier
    and allgather, done with a MultiWorkerMirroredStrategy's collectives,
    so that the MWMS workers are timed by the same code as the MPI ranks."""

    def __init__(self, tf, strategy):
        self._tf, self._strategy = tf, strategy
        self._task = strategy.cluster_resolver.task_id
        self._workers = strategy.num_replicas_in_sync
        self._sum = strategy_sum(tf, strategy)
        self._token = tf.constant([1.0])

    def Barrier(self):  # noqa: N802  (MPI's name)
        self._sum(self._token)

    def allgather(self, times):
        """{label: seconds[]} of every worker, in worker order: each worker
        fills its own slot of a zero array, and one sum gathers them."""
        labels = list(times)
        slots = np.zeros((self._workers, len(labels),
                          len(times[labels[0]])), np.float64)
        slots[self._task] = [times[label] for label in labels]
        gathered = self._sum(self._tf.constant(slots)).numpy()
        return [{label: gathered[w, i] for i, label in enumerate(labels)}
                for w in range(self._workers)]


def strategy_sum(tf, strategy):
    """A tf.function summing a tensor (or list of tensors) over the workers
    with the replica context's all_reduce inside strategy.run."""

    def replica_sum(value):
        # tf.identity puts the value on this replica's device: all_reduce
        # finds no destination for a function input that has no device
        # ("destinations can not be empty").
        local = tf.nest.map_structure(tf.identity, value)
        return tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, local)

    @tf.function
    def all_sum(value):
        return strategy.run(replica_sum, args=(value,))

    return all_sum


def run_mwms_collectives(args):
    """A MultiWorkerMirroredStrategy worker (TF_CONFIG) timing its
    strategy's all_reduce on the same cases."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    implementation = getattr(
        tf.distribute.experimental.CommunicationImplementation,
        args.implementation.upper())
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=implementation))
    timing = import_timing_without_mpi_init()
    comm = StrategyComm(tf, strategy)
    rank = strategy.cluster_resolver.task_id
    mode = f"mwms-{args.implementation}"
    results, gradient_set = {}, None
    for case in args.cases:
        shapes = shapes_of(case)
        if case == GRADIENT_SET_CASE:
            gradient_set = describe_gradient_set(shapes)
            value = [tf.constant(np.full(s, rank + 1, np.float32))
                     for s in shapes]
        else:
            value = tf.constant(np.full(shapes[0], rank + 1, np.float32))
        all_sum = strategy_sum(tf, strategy)
        check_sums(f"{mode} all_reduce", all_sum(value),
                   strategy.num_replicas_in_sync)
        times = timing.measure(comm, {mode: lambda: all_sum(value)},
                               repeats_for(args, case))
        results[case] = {label: [float(t) for t in samples]
                         for label, samples in times.items()}
    if rank == 0:
        kw.report({"job": mode, "cases": results,
                   "gradient_set": gradient_set})


# ------------------------------------------- collectives: orchestrator --

def collective_jobs(args):
    """The collective jobs to run, each (name, launches, modes it
    measures), and the collective cases."""
    modes = [m for m in args.modes if m in COLLECTIVE_MODES]
    cases = [c for c in args.cases if c in COLLECTIVE_CASES]
    if not cases:
        return [], cases
    common = ["--cases", ",".join(cases), "--repeats", str(args.repeats),
              "--large-repeats", str(args.large_repeats)]
    jobs = []
    mpi_modes = [m for m in modes if m in ("mpi", "tfring")]
    if mpi_modes:
        jobs.append(("mpi", [kw.Launch(
            [sys.executable, "-m", "tfring.launcher.cli", "-np", "2",
             sys.executable, SCRIPT, "--worker", "mpi-collectives",
             "--modes", ",".join(mpi_modes)] + common)], mpi_modes))
    for mode in ("mwms-ring", "mwms-auto"):
        if mode in modes:
            cluster = kw.localhost_cluster(worker=2)
            jobs.append((mode, [kw.Launch(
                [sys.executable, SCRIPT, "--worker", "mwms-collectives",
                 "--implementation", mode.split("-")[1]] + common,
                {"TF_CONFIG": kw.tf_config(cluster, "worker", i)})
                for i in range(2)], [mode]))
    return jobs, cases


def collective_rows(job_result, modes, cases):
    """Table rows (dicts) from one collective job's report."""
    rows = []
    for case in cases:
        times = job_result["cases"][case]
        for mode in modes:
            candidates = {label: samples for label, samples in times.items()
                          if label == mode or label.startswith(mode + " ")}
            best = min(candidates,
                       key=lambda label: np.median(candidates[label]))
            samples = candidates[best]
            row = new_row(case, mode, seconds=float(np.median(samples)))
            row.update(min_seconds=float(np.min(samples)),
                       repeats=len(samples), samples=samples,
                       variants={label: float(np.median(s))
                                 for label, s in candidates.items()})
            if mode == "mpi" and case == GRADIENT_SET_CASE:
                row["notes"].append("mpi-grads")
                row["variant"] = MPI_GRADIENT_VARIANTS[best]
            rows.append(row)
    return rows


def run_collectives(args, log):
    jobs, cases = collective_jobs(args)
    rows, gradient_set, mpi_library = [], None, None
    for name, launches, modes in jobs:
        log(f"collectives: {name} ({', '.join(modes)}) on "
            f"{', '.join(cases)} ...")
        group = kw.run_processes(launches, args.collective_timeout)
        failure = kw.describe_failure(group, 1, args.collective_timeout)
        if failure is not None:
            log(f"  FAILED after {group.seconds:.0f} s: {failure}")
            show_output(args, name, group)
            rows += [new_row(case, mode, failure=failure)
                     for case in cases for mode in modes]
            continue
        result = group.results[0]
        gradient_set = result.get("gradient_set") or gradient_set
        mpi_library = result.get("mpi_library") or mpi_library
        rows += collective_rows(result, modes, cases)
        log(f"  done in {group.seconds:.0f} s")
    return rows, gradient_set, mpi_library


# --------------------------------------------------- training: workers --

def run_fit_worker(args):
    kw.train_and_report(
        args.mode, model_name=args.model, image_size=args.image_size,
        batch_size=args.batch_size, warmup_steps=args.warmup_steps,
        steps=args.steps, intra_op_threads=1, process=args.process,
        barrier_dir=args.barrier_dir, barrier_count=2)


# ---------------------------------------------- training: orchestrator --

def fit_settings(args, case):
    spec = dict(FIT_CASES[case])
    if args.quick:
        spec["warmup_steps"] = spec["quick_warmup_steps"]
        spec["steps"] = spec["quick_steps"]
        spec["rounds"] = 1
    if args.rounds is not None:
        spec["rounds"] = args.rounds
    return spec


def fit_worker_command(role, spec, extra=()):
    return [sys.executable, SCRIPT, "--worker", role,
            "--model", spec["model"],
            "--image-size", str(spec["image_size"]),
            "--batch-size", str(spec["batch_size"]),
            "--warmup-steps", str(spec["warmup_steps"]),
            "--steps", str(spec["steps"])] + list(extra)


def fit_launches(mode, spec, barrier_dir):
    """The processes (kw.Launch) of one training run of `mode`."""
    if mode == "tfring":
        return [kw.Launch([sys.executable, "-m", "tfring.launcher.cli", "-np", "2"]
                          + fit_worker_command("fit", spec,
                                               ["--mode", "tfring"]))]
    if mode == "ceiling":
        return [kw.Launch(fit_worker_command("fit", spec, [
            "--mode", "ceiling", "--process", str(i),
            "--barrier-dir", barrier_dir])) for i in range(2)]
    if mode == "mwms-auto":
        cluster = kw.localhost_cluster(worker=2)
        return [kw.Launch(fit_worker_command("fit", spec, ["--mode", "mwms"]),
                          {"TF_CONFIG": kw.tf_config(cluster, "worker", i)})
                for i in range(2)]
    # pss: the coordinator ends the run; the servers run until killed.
    cluster = kw.localhost_cluster(chief=1, ps=1, worker=2)
    launches = [kw.Launch(fit_worker_command("pss-coordinator", spec),
                          {"TF_CONFIG": kw.tf_config(cluster, "chief", 0)})]
    for task_type, count in (("ps", 1), ("worker", 2)):
        launches += [kw.Launch([sys.executable, SCRIPT, "--worker",
                                "pss-server"],
                               {"TF_CONFIG": kw.tf_config(cluster, task_type,
                                                          i)}, wait=False)
                     for i in range(count)]
    return launches


def run_fit_once(args, mode, spec):
    """One training run: (report dicts, None) or (None, reason)."""
    expected = 1 if mode == "pss" else 2
    with tempfile.TemporaryDirectory(prefix="tfring_compare_") as barrier:
        group = kw.run_processes(fit_launches(mode, spec, barrier),
                                 args.fit_timeout)
    failure = kw.describe_failure(group, expected, args.fit_timeout)
    if failure is not None:
        show_output(args, mode, group)
        return None, failure, group.seconds
    return group.results, None, group.seconds


def run_fit_case(args, case, log):
    spec = fit_settings(args, case)
    modes = [m for m in FIT_MODES if m in args.modes]
    totals = {mode: [] for mode in modes}
    failures = {mode: [] for mode in modes}
    fit_error = None
    for round_index in range(spec["rounds"]):
        shift = round_index % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            results, failure, seconds = run_fit_once(args, mode, spec)
            if failure is not None:
                failures[mode].append(failure)
                log(f"  {case} round {round_index + 1} {mode:10s} FAILED "
                    f"({seconds:.0f} s): {failure}")
                continue
            total = sum(r["img_per_sec"] for r in results)
            totals[mode].append(total)
            if mode == "pss":
                fit_error = results[0].get("fit_error")
            log(f"  {case} round {round_index + 1} {mode:10s} "
                f"{total:9.1f} img/s ({seconds:.0f} s)")
    rows = []
    for mode in modes:
        if not totals[mode]:
            rows.append(new_row(case, mode, failure="; ".join(
                sorted(set(failures[mode])))))
            continue
        img_per_sec = statistics.median(totals[mode])
        # Time per step of one process: its batch over its share of the
        # total rate (2 processes train in every mode).
        row = new_row(case, mode,
                      seconds=spec["batch_size"] * 2 / img_per_sec)
        row.update(img_per_sec=img_per_sec, rounds=totals[mode],
                   settings={k: spec[k] for k in (
                       "model", "image_size", "batch_size",
                       "warmup_steps", "steps")})
        if mode == "mwms-auto":
            row["notes"].append("mwms-fit")
        if mode == "pss":
            row["notes"].append("pss-fit")
            row["fit_error"] = fit_error
        if failures[mode]:
            row["failed_rounds"] = failures[mode]
        rows.append(row)
    return rows, fit_error


# ------------------------------------------------------------ reporting --

def new_row(case, mode, seconds=None, failure=None):
    return {"case": case, "kind": "fit" if case in FIT_CASES else
            "collective", "mode": mode, "seconds": seconds,
            "failure": failure, "notes": []}


def add_ratios(rows):
    """ratio_to_tfring: a row's time over tfring's for the same case."""
    tfring = {r["case"]: r["seconds"] for r in rows
              if r["mode"] == "tfring" and r["seconds"]}
    for row in rows:
        base = tfring.get(row["case"])
        row["ratio_to_tfring"] = (row["seconds"] / base
                                  if base and row["seconds"] else None)


def machine_description():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f
                     if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f
                           if line.startswith("MemTotal")).split()[1])
            memory = round(kib / 1024 / 1024)
    except (OSError, StopIteration, ValueError):
        pass
    return {"cpu": model, "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)),
            "memory_gib": memory,
            "os": f"{platform.system()} {platform.release()}"}


def software_versions():
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for key, names in (("tensorflow", ("tensorflow", "tensorflow-cpu")),
                       ("keras", ("keras",)), ("mpi4py", ("mpi4py",)),
                       ("numpy", ("numpy",))):
        for name in names:
            try:
                versions[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions


def note_texts(rows, fit_error):
    """Footnote number per note key used in rows, and the footnote texts."""
    used = []
    for row in rows:
        for key in row["notes"]:
            if key not in used:
                used.append(key)
    variant = next((r.get("variant") for r in rows
                    if r.get("variant")), "")
    texts = []
    for key in used:
        texts.append(NOTES[key].format(
            variant=variant,
            fit_error=(f"here fit fails with {fit_error.rstrip('.')!r}"
                       if fit_error
                       else "here fit was not tried")))
    return {key: i + 1 for i, key in enumerate(used)}, texts


def ordered(rows):
    def key(row):
        mode_order = FIT_MODES if row["kind"] == "fit" else COLLECTIVE_MODES
        return CASES.index(row["case"]), mode_order.index(row["mode"])
    return sorted(rows, key=key)


def format_table(rows, gradient_set, note_numbers):
    """The results table as text lines."""
    lines = []
    header = (f"{'workload':<42} {'mode':<28} {'time ms':>10} "
              f"{'img/s':>8} {'x tfring':>9}  notes")
    lines += [header, "-" * len(header)]
    previous = None
    for row in ordered(rows):
        label = (case_label(row["case"], gradient_set)
                 if row["case"] != previous else "")
        if row["case"] != previous and previous is not None:
            lines.append("")
        previous = row["case"]
        names = FIT_MODE_NAMES if row["kind"] == "fit" else MODE_NAMES
        notes = ",".join(f"[{note_numbers[k]}]" for k in row["notes"])
        if row["failure"]:
            lines.append(f"{label:<42} {names[row['mode']]:<28} "
                         f"FAILED: {row['failure'][:120]}")
            continue
        time_ms = row["seconds"] * 1e3
        time_text = f"{time_ms:10.3f}" if time_ms < 100 else f"{time_ms:10.1f}"
        rate = (f"{row['img_per_sec']:8.1f}" if row.get("img_per_sec")
                else f"{'-':>8}")
        ratio = (f"{row['ratio_to_tfring']:9.2f}"
                 if row["ratio_to_tfring"] is not None else f"{'-':>9}")
        lines.append(f"{label:<42} {names[row['mode']]:<28} {time_text} "
                     f"{rate} {ratio}  {notes}".rstrip())
    return lines


def markdown_report(report):
    """A saved report (--json) as Markdown: what ran where, the table of
    times and ratios, and its footnotes (for the documentation site)."""
    rows = report["rows"]
    note_numbers, _ = note_texts(ordered(rows), report.get("pss_fit_error"))
    machine, versions = report["machine"], report["versions"]
    lines = [
        f"Measured {report['date']} on {machine['cpu']}, {machine['cores']} "
        f"cores, {machine['memory_gib']} GiB, {machine['os']}; TensorFlow "
        f"{versions.get('tensorflow')}, Keras {versions.get('keras')}, "
        f"{report.get('mpi_library') or 'MPI'}, mpi4py "
        f"{versions.get('mpi4py')}, Python {versions['python']} "
        f"(`{report['command']}`, {report['seconds']:.0f} s). Time: "
        f"collectives, the median of one reduction (the slower process's); "
        f"fit, one training step. \"x tfring\": the time over tfring's, "
        f"above 1 is slower than tfring.",
        "",
        "| workload | mode | time (ms) | img/s | x tfring |",
        "|---|---|---:|---:|---:|"]
    previous = None
    for row in ordered(rows):
        label = (case_label(row["case"], report.get("gradient_set"))
                 if row["case"] != previous else "")
        previous = row["case"]
        names = FIT_MODE_NAMES if row["kind"] == "fit" else MODE_NAMES
        mode = names[row["mode"]]
        if row["mode"] == "tfring":
            mode = f"**{mode}**"
        mode += "".join(f" [{note_numbers[k]}]" for k in row["notes"])
        if row["failure"]:
            lines.append(f"| {label} | {mode} | failed | | |")
            continue
        time_ms = row["seconds"] * 1e3
        rate = (f"{row['img_per_sec']:.1f}" if row.get("img_per_sec")
                else "")
        ratio = (f"{row['ratio_to_tfring']:.2f}"
                 if row["ratio_to_tfring"] is not None else "")
        lines.append(f"| {label} | {mode} | {time_ms:.4g} | {rate} | "
                     f"{ratio} |")
    lines.append("")
    for number, text in enumerate(report.get("footnotes", []), 1):
        lines.append(f"[{number}] {text}")
        lines.append("")
    return "\n".join(lines)


def busy_before(report):
    """Whether other work ran on the machine as the run started."""
    return report["load_before"] > 0.5 * report["machine"]["cores"]


def print_report(report, rows, note_texts_list, note_numbers):
    machine, versions = report["machine"], report["versions"]
    print()
    print("tfring vs tf.distribute: 2 processes on one machine, one intra-op "
          "thread each")
    print(f"date: {report['date']}")
    print(f"machine: {machine['cpu']}, {machine['cores']} cores "
          f"({machine['usable_cores']} usable), {machine['memory_gib']} GiB, "
          f"{machine['os']}; load average {report['load_before']:.1f} "
          f"before, {report['load_after']:.1f} after")
    print(f"software: TensorFlow {versions.get('tensorflow')}, Keras "
          f"{versions.get('keras')}, {report.get('mpi_library') or 'MPI'}, "
          f"mpi4py {versions.get('mpi4py')}, Python {versions['python']}")
    print(f"command: {report['command']}")
    if busy_before(report):
        print(f"note: the machine was busy before this run started (load "
              f"average {report['load_before']:.1f} on {machine['cores']} "
              f"cores): other processes shared the CPUs, so these numbers, "
              f"the training rows most, are noisy")
    print()
    for line in format_table(rows, report.get("gradient_set"), note_numbers):
        print(line)
    print()
    print("time ms: collectives, the median time of one reduction (the slower "
          "process's, per repetition);\n  fit, the time of one training step "
          "of one process. x tfring: the time over tfring's time\n  for the "
          "same workload (above 1: slower than tfring).")
    for number, text in enumerate(note_texts_list, 1):
        print(f"[{number}] {text}")
    print(f"measured in {report['seconds']:.0f} s", flush=True)


def write_plot(path, rows, report, gradient_set):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in CASES if any(r["case"] == c for r in rows)]
    colors = {"mpi": "tab:blue", "mwms-ring": "tab:orange",
              "mwms-auto": "tab:red", "pss": "tab:purple",
              "ceiling": "tab:gray"}
    figure, axes = plt.subplots(figsize=(max(8, 1.6 * len(cases)), 5))
    labelled = set()
    for x, case in enumerate(cases):
        bars = [r for r in ordered(rows) if r["case"] == case
                and r["mode"] != "tfring" and r["ratio_to_tfring"]]
        width = 0.8 / max(1, len(bars))
        for i, row in enumerate(bars):
            mode = row["mode"]
            drawn = axes.bar(x + (i - (len(bars) - 1) / 2) * width,
                             row["ratio_to_tfring"], width,
                             color=colors[mode],
                             label=None if mode in labelled
                             else MODE_NAMES[mode])
            labelled.add(mode)
            axes.bar_label(drawn, fmt="%.2g", fontsize=7, padding=1)
    axes.axhline(1.0, color="black", linewidth=1, label="tfring")
    axes.set_yscale("log")
    axes.set_ylabel("time / tfring's time (log; above 1: slower)")
    axes.set_xticks(range(len(cases)))
    axes.set_xticklabels([case_label(c, gradient_set).replace(", ", "\n")
                          .replace(" (", "\n(") for c in cases], fontsize=8)
    machine = report["machine"]
    axes.set_title(f"tfring vs tf.distribute, 2 processes: "
                   f"{machine['cpu']}, {machine['cores']} cores, "
                   f"{report['date'][:10]}", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---------------------------------------------------------- orchestrator --

def show_output(args, name, group):
    if args.show_failures:
        output = "\n".join(group.outputs)
        sys.stderr.write(f"----- {name} output -----\n{output[-6000:]}\n")


def orchestrate(args):
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    date = datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")

    def log(text):
        print(text, flush=True)

    log(f"compare: cases {','.join(args.cases)}; modes "
        f"{','.join(args.modes)}; {'quick' if args.quick else 'full'} run")
    rows, gradient_set, mpi_library = run_collectives(args, log)
    fit_error = None
    for case in [c for c in args.cases if c in FIT_CASES]:
        log(f"training: {case} ...")
        case_rows, case_fit_error = run_fit_case(args, case, log)
        rows += case_rows
        fit_error = fit_error or case_fit_error
    add_ratios(rows)
    numbers, texts = note_texts(rows, fit_error)
    command = " ".join(["python benchmarks/compare.py"]
                       + [shlex.join(sys.argv[1:])] * bool(sys.argv[1:]))
    report = {
        "date": date, "command": command,
        "machine": machine_description(), "versions": software_versions(),
        "mpi_library": mpi_library or mpirun_version(),
        "load_before": load_before, "load_after": os.getloadavg()[0],
        "seconds": time.monotonic() - started, "quick": args.quick,
        "settings": {"repeats": args.repeats,
                     "large_repeats": args.large_repeats,
                     "fit": {c: fit_settings(args, c) for c in args.cases
                             if c in FIT_CASES}},
        "gradient_set": gradient_set, "pss_fit_error": fit_error,
        "footnotes": texts, "rows": ordered(rows),
    }
    print_report(report, rows, texts, numbers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
        print(f"numbers written to {args.json}")
    if args.plot:
        write_plot(args.plot, rows, report, gradient_set)
        print(f"plot written to {args.plot}")
    return 1 if any(r["failure"] for r in rows) else 0


def mpirun_version():
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    try:
        output = subprocess.run([mpirun if os.path.exists(mpirun) else
                                 "mpirun", "--version"], capture_output=True,
                                text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return output.splitlines()[0].replace("mpirun (", "").replace(")", "") \
        if output else None


def comma_list(choices):
    def parse(text):
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in choices]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {unknown or text!r}; expected a comma-separated "
                f"subset of {','.join(choices)}")
        return [c for c in choices if c in items]
    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"cases: {','.join(CASES)}\nmodes: {','.join(MODES)}")
    parser.add_argument("--quick", action="store_true",
                        help="tiny repeats and step counts: a smoke run")
    parser.add_argument("--cases", type=comma_list(CASES), default=list(CASES),
                        help="workloads (rows) to run, comma-separated "
                             "(default all)")
    parser.add_argument("--modes", type=comma_list(MODES), default=list(MODES),
                        help="implementations to run, comma-separated "
                             "(default all; mwms-auto is also the MWMS of "
                             "the fit cases)")
    parser.add_argument("--json", metavar="OUT",
                        help="write every number (and every sample) here")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="draw the ratios to tfring (needs matplotlib)")
    parser.add_argument("--markdown", metavar="REPORT.json",
                        help="print a report saved with --json as a Markdown "
                             "table and exit (runs nothing)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed repetitions of tensors up to 4 MiB "
                             "(default 100; --quick 10)")
    parser.add_argument("--large-repeats", type=int, default=None,
                        help="timed repetitions of 64 MiB and the gradient "
                             "set (default 20; --quick 3)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds over the modes of each fit case "
                             "(default 3 for the CNN, 1 for ResNet-50; "
                             "--quick 1)")
    parser.add_argument("--collective-timeout", type=float, default=None,
                        help="seconds one collective job may take "
                             "(default 420; --quick 180)")
    parser.add_argument("--fit-timeout", type=float, default=None,
                        help="seconds one training run may take "
                             "(default 420; --quick 240)")
    parser.add_argument("--show-failures", action="store_true",
                        help="print the output of failed runs")
    worker = parser.add_argument_group("worker side (set by the "
                                       "orchestrator)")
    worker.add_argument("--worker", choices=(
        "mpi-collectives", "mwms-collectives", "fit", "pss-coordinator",
        "pss-server"), help=argparse.SUPPRESS)
    worker.add_argument("--implementation", choices=("ring", "auto"),
                        help=argparse.SUPPRESS)
    worker.add_argument("--mode", help=argparse.SUPPRESS)
    worker.add_argument("--model", choices=kw.MODELS,
                        help=argparse.SUPPRESS)
    worker.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    worker.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    worker.add_argument("--warmup-steps", type=int, help=argparse.SUPPRESS)
    worker.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    worker.add_argument("--process", type=int, default=0,
                        help=argparse.SUPPRESS)
    worker.add_argument("--barrier-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = ({"repeats": 10, "large_repeats": 3, "collective_timeout": 180,
                 "fit_timeout": 240} if args.quick else
                {"repeats": 100, "large_repeats": 20,
                 "collective_timeout": 420, "fit_timeout": 420})
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.plot and args.worker is None and \
            importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib, which is not installed here "
                     "(pip install matplotlib); run without --plot, or "
                     "with --json, to get the numbers")
    if min(args.repeats, args.large_repeats) < 1 or (
            args.rounds is not None and args.rounds < 1):
        parser.error("--repeats, --large-repeats and --rounds must be at "
                     "least 1")
    return args


def run_worker(args):
    if args.worker == "mpi-collectives":
        run_mpi_collectives(args)
    elif args.worker == "mwms-collectives":
        run_mwms_collectives(args)
    elif args.worker == "fit":
        run_fit_worker(args)
    elif args.worker == "pss-coordinator":
        kw.train_pss_coordinator(
            model_name=args.model, image_size=args.image_size,
            batch_size=args.batch_size, warmup_steps=args.warmup_steps,
            steps=args.steps, intra_op_threads=1)
    else:
        kw.serve_pss_task(intra_op_threads=1)


def _stop_on_signal(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None):
    args = parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown_report(json.load(f)))
        return 0
    if args.worker is not None:
        run_worker(args)
        return 0
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on_signal)
    try:
        return orchestrate(args)
    finally:
        kw.kill_all_started()


if __name__ == "__main__":
    sys.exit(main())
