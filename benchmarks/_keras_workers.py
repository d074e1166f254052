"""Training workers and process handling shared by the Keras benchmarks.

benchmarks/keras_scaling.py and benchmarks/compare.py both time keras
training in fresh processes that they start themselves: two tfring ranks
under tfringrun, two MultiWorkerMirroredStrategy workers with TF_CONFIG, two
independent processes (the no-communication ceiling), and, for compare.py, a
ParameterServerStrategy cluster. This module holds both halves:

worker side (runs inside a started process)
  build_model            the small CNN of keras_examples/
                         keras_synthetic_benchmark.py, or
                         keras.applications.ResNet50(weights=None)
  patch_keras_for_mwms   the two Keras 3 fixes model.fit needs under
                         MultiWorkerMirroredStrategy (keras-team/keras#20585)
  train_and_report       model.fit on synthetic data, timing the steps after
                         the warm-up ones; prints one RESULT_PREFIX line
  serve_pss_task,        a ParameterServerStrategy parameter server or worker,
  train_pss_coordinator  and its coordinator running a ClusterCoordinator
                         training loop (Keras 3 has no model.fit for PSS,
                         keras-team/keras#18624)

orchestrator side
  run_processes          starts a group of processes, waits for the ones that
                         must finish (with a deadline), stops at the first
                         failure, and always ends every process it started
  free_ports, tf_config  cluster addresses on localhost
  kill_all_started       for a caller's finally: ends whatever is still
                         running

Every process started here carries an environment tag (TAG_VARIABLE): mpirun
puts its ranks in process groups of their own, so the tag is what finds them
all when a group is stopped. Direct children also die with the orchestrator
(PR_SET_PDEATHSIG), so even a killed orchestrator leaves no worker behind.

MultiWorkerMirroredStrategy and Keras 3: `model.fit` under MWMS with 2
workers fails as shipped (keras-team/keras#20585). Two places in
keras/src/backend/tensorflow/trainer.py assume a single worker;
patch_keras_for_mwms replaces both in the worker's own process:
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
"""

import collections
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import process_reaping  # noqa: E402

TAG_VARIABLE = "TFRING_BENCHMARK_TAG"
RESULT_PREFIX = "BENCHMARK_RESULT "

MWMS_ISSUE_URL = "https://github.com/keras-team/keras/issues/20585"
PSS_ISSUE_URL = "https://github.com/keras-team/keras/issues/18624"
MWMS_PATCH_NOTE = (
    "MWMS runs with two patches to Keras 3.x's TF trainer, applied inside the "
    "benchmark's worker (keras-team/keras#20585): _maybe_symbolic_build takes "
    "each worker's local first batch instead of strategy.reduce() of a tuple "
    "of PerReplica values, and reduce_per_replica averages the scalar logs "
    "across workers with axis=None instead of axis=0.")

MODELS = ("cnn", "resnet50")
NUM_CLASSES = 10


# ---------------------------------------------------------------- worker --

def build_model(keras, name, image_size):
    """The small CNN of keras_examples/keras_synthetic_benchmark.py, or
    ResNet-50 (random weights) for image_size x image_size images; both
    return logits for NUM_CLASSES classes."""
    if name == "resnet50":
        return keras.applications.ResNet50(
            weights=None, input_shape=(image_size, image_size, 3),
            classes=NUM_CLASSES, classifier_activation=None)
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ])


def new_optimizer(keras):
    return keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)


def new_loss(keras):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def synthetic_batch(tf, batch, image_size):
    images = tf.random.uniform((batch, image_size, image_size, 3))
    labels = tf.random.uniform((batch,), maxval=NUM_CLASSES, dtype=tf.int64)
    return images, labels


def patch_keras_for_mwms(tf):
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


def wait_for_peers(directory, index, count, timeout=120.0):
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


def report(result):
    """Hands a worker's numbers to the orchestrator (one stdout line)."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def bind_to_cpu_share(index, count):
    """Binds this process to the index-th of `count` contiguous shares of
    the CPUs it may run on, in CPU number order, when there are at least
    `count` of them: as tfring binds the ranks of a host (which also keeps
    each core's hardware threads together)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < count:
        return
    share = allowed[index * len(allowed) // count:
                    (index + 1) * len(allowed) // count]
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), share)
        except OSError:  # the thread ended meanwhile
            pass


def train_and_report(mode, model_name="cnn", image_size=32, batch_size=32,
                     warmup_steps=20, steps=500, intra_op_threads=1,
                     process=0, barrier_dir=None, barrier_count=1):
    """model.fit in this process as one of a mode's processes, then report().

    mode: "tfring" (a rank of a tfringrun job: DistributedOptimizer),
    "mwms" / "mwms-shipped" (a MultiWorkerMirroredStrategy worker from
    TF_CONFIG, with / without patch_keras_for_mwms), or anything else for a
    process without communication ("ceiling", "single"). Under MWMS fit()
    splits a global batch, so every process still trains on batch_size
    images per step. Steps after the first warmup_steps are timed; with
    barrier_dir, the processes wait for each other before timing starts.
    """
    if mode in ("ceiling", "mwms", "mwms-shipped"):
        # The other 2-process modes each bound to its own share of the CPUs
        # (as TFRING_CPU_BINDING=1 binds tfring's ranks): the best these
        # baselines can do here, which makes the ceiling the higher bar.
        index = (json.loads(os.environ["TF_CONFIG"])["task"]["index"]
                 if mode != "ceiling" else process)
        bind_to_cpu_share(index, 2)
    import tensorflow as tf

    if intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    strategy = None
    if mode in ("mwms", "mwms-shipped"):
        # Before any other TensorFlow op: the strategy configures the
        # runtime's collectives from TF_CONFIG.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    hvd = None
    if mode == "tfring":
        import tfring as hvd
        import tfring.keras  # noqa: F401  (hvd.keras.callbacks)
        hvd.init()
        process = hvd.rank()
    elif strategy is not None:
        if mode == "mwms":
            patch_keras_for_mwms(tf)
        process = strategy.cluster_resolver.task_id
    keras.utils.set_random_seed(process)

    def compile_model():
        model = build_model(keras, model_name, image_size)
        optimizer = new_optimizer(keras)
        if hvd is not None:
            optimizer = hvd.DistributedOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss=new_loss(keras))
        return model

    if strategy is not None:
        with strategy.scope():
            model = compile_model()
    else:
        model = compile_model()

    workers = strategy.num_replicas_in_sync if strategy is not None else 1
    dataset = tf.data.Dataset.from_tensors(
        synthetic_batch(tf, batch_size * workers, image_size)).repeat()
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
            if self.done == self.skip and barrier_dir:
                wait_for_peers(barrier_dir, process, barrier_count)
            now = time.perf_counter()
            if self.done == self.skip:
                self.start, self.wall_start = now, time.time()
            elif self.done > self.skip:
                self.timed += 1
                self.end, self.wall_end = now, time.time()

    timer = StepTimer(warmup_steps)
    callbacks = [timer]
    if hvd is not None:
        callbacks.insert(
            0, hvd.keras.callbacks.BroadcastGlobalVariablesCallback(0))
    model.fit(dataset, epochs=1, shuffle=False,
              steps_per_epoch=warmup_steps + steps,
              callbacks=callbacks, verbose=0)
    seconds = timer.end - timer.start
    report({"mode": mode, "process": process,
            "img_per_sec": batch_size * timer.timed / seconds,
            "steps": timer.timed, "seconds": seconds,
            "wall_start": timer.wall_start, "wall_end": timer.wall_end})


def _pss_server_config(tf, intra_op_threads):
    return tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=intra_op_threads)


def serve_pss_task(intra_op_threads=1):
    """A ParameterServerStrategy "ps" or "worker" task (from TF_CONFIG): a
    gRPC server that runs what the coordinator sends, until killed."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type,
        task_index=resolver.task_id, protocol="grpc",
        config=_pss_server_config(tf, intra_op_threads), start=True)
    server.join()


def _fit_failure_under_pss(keras, tf, strategy, model_name, image_size,
                           batch_size):
    """What Keras 3's model.fit does under ParameterServerStrategy: the
    error message, or None if fit ran."""
    with strategy.scope():
        model = build_model(keras, model_name, image_size)
        model.compile(optimizer=new_optimizer(keras), loss=new_loss(keras))
    dataset = tf.data.Dataset.from_tensors(
        synthetic_batch(tf, batch_size, image_size)).repeat()
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0)
    except Exception as error:  # noqa: BLE001  (reported, not handled)
        return f"{type(error).__name__}: {error}".splitlines()[0][:300]
    return None


def train_pss_coordinator(model_name="cnn", image_size=32, batch_size=32,
                          warmup_steps=20, steps=500, intra_op_threads=1):
    """The coordinator ("chief") of a ParameterServerStrategy cluster.

    First tries model.fit (Keras 3 does not support it under PSS; the error
    goes into the report), then trains the same model, optimizer and loss
    with the closest thing Keras 3 allows: a custom training loop that a
    tf.distribute.coordinator.ClusterCoordinator schedules on the workers.
    Each scheduled step is one worker's step on batch_size images; the
    workers apply their gradients to the variables on the parameter server
    asynchronously (no averaging, no waiting for each other), which is PSS
    training as TensorFlow ships it. The coordinator schedules
    warmup_steps and then `steps` steps per worker; the timed window is the
    second batch of schedules up to coordinator.join().
    """
    import tensorflow as tf

    if intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    import keras

    keras.utils.set_random_seed(0)
    fit_error = _fit_failure_under_pss(keras, tf, strategy, model_name,
                                       image_size, batch_size)
    with strategy.scope():
        model = build_model(keras, model_name, image_size)
        optimizer = new_optimizer(keras)
        optimizer.build(model.trainable_variables)
    loss_fn = new_loss(keras)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensors(
            synthetic_batch(tf, batch_size, image_size)).repeat()))

    @tf.function
    def train_step(iterator):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(
                zip(gradients, model.trainable_variables))
            return loss

        return strategy.run(replica_step, args=next(iterator))

    def run_steps(count):
        for _ in range(count):
            coordinator.schedule(train_step, args=(iterator,))
        coordinator.join()

    run_steps(warmup_steps * workers)
    start, wall_start = time.perf_counter(), time.time()
    run_steps(steps * workers)
    seconds = time.perf_counter() - start
    report({"mode": "pss", "process": "coordinator",
            "img_per_sec": batch_size * steps * workers / seconds,
            "steps": steps * workers, "seconds": seconds,
            "wall_start": wall_start, "wall_end": time.time(),
            "fit_error": fit_error})


# ---------------------------------------------------------- orchestrator --

Launch = collections.namedtuple("Launch", "argv env wait",
                                defaults=({}, True))
Launch.__doc__ = """One process to start: argv, extra environment, and
whether the group is done only when it exits (False for servers that run
until killed)."""

ProcessGroup = collections.namedtuple(
    "ProcessGroup", "outcome seconds returncodes outputs results")
ProcessGroup.__doc__ = """What run_processes saw: outcome "done", "failed"
(a process exited non-zero first) or "timed out"; one output text and exit
status per process; and every RESULT_PREFIX line, decoded."""

_started_tags = set()


def _die_with_parent():
    """In the child before exec: SIGKILL when the orchestrator dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(
            1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def kill_tagged(tag):
    """Ends every process started with this tag, ranks of mpirun included."""
    process_reaping.kill_until_gone(
        lambda: process_reaping.pids_with_environment_entry(TAG_VARIABLE, tag),
        deadline_s=0.6, pause_s=0.2)


def kill_all_started():
    """Ends whatever any run_processes call of this process left running
    (for an orchestrator's finally, e.g. after Ctrl-C)."""
    for tag in list(_started_tags):
        kill_tagged(tag)
        _started_tags.discard(tag)


def free_ports(count):
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


def localhost_cluster(**task_counts):
    """A TF_CONFIG cluster on free localhost ports, e.g. worker=2."""
    ports = iter(free_ports(sum(task_counts.values())))
    return {job: [f"localhost:{next(ports)}" for _ in range(count)]
            for job, count in task_counts.items()}


def tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster,
                       "task": {"type": task_type, "index": index}})


def _child_environment(tag):
    env = dict(os.environ)
    env[TAG_VARIABLE] = tag
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The working tree's tfring, after anything the caller put first.
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in [env.get("PYTHONPATH")] if p] + [REPO])
    return env


def _wait_for_group(processes, launches, timeout):
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in processes]
        if any(code not in (None, 0) for code in codes):
            return "failed"
        if all(code is not None
               for code, launch in zip(codes, launches) if launch.wait):
            return "done"
        if time.monotonic() > deadline:
            return "timed out"
        time.sleep(0.05)


def run_processes(launches, timeout):
    """Starts `launches` (Launch tuples) together and returns a
    ProcessGroup once every process with wait=True has exited, one process
    has failed, or `timeout` seconds have passed. Every process started
    (and every rank mpirun started) is ended before this returns."""
    tag = uuid.uuid4().hex
    _started_tags.add(tag)
    env = _child_environment(tag)
    started = time.monotonic()
    processes = []
    with tempfile.TemporaryDirectory(prefix="tfring_benchmark_") as logs:
        files = []
        try:
            for index, launch in enumerate(launches):
                files.append(open(os.path.join(logs, f"{index}.log"), "w+",
                                  errors="replace"))
                processes.append(subprocess.Popen(
                    launch.argv, stdin=subprocess.DEVNULL, stdout=files[-1],
                    stderr=subprocess.STDOUT, env=dict(env, **launch.env),
                    cwd=REPO, start_new_session=True,
                    preexec_fn=_die_with_parent))
            outcome = _wait_for_group(processes, launches, timeout)
        finally:
            kill_tagged(tag)
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
            _started_tags.discard(tag)
            outputs = []
            for f in files:
                f.seek(0)
                outputs.append(f.read())
                f.close()
    results = [json.loads(line[len(RESULT_PREFIX):])
               for output in outputs for line in output.splitlines()
               if line.startswith(RESULT_PREFIX)]
    return ProcessGroup(outcome, time.monotonic() - started,
                        [p.returncode for p in processes], outputs, results)


def failure_reason(output):
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


def describe_failure(group, expected_results, timeout):
    """Why a group gave no usable result, or None if it did."""
    if group.outcome == "timed out":
        return f"timed out after {timeout:.0f} s"
    if group.outcome == "failed" or len(group.results) != expected_results:
        failed = [o for o, code in zip(group.outputs, group.returncodes)
                  if code not in (0, None, -signal.SIGKILL)]
        output = failed[0] if failed else "\n".join(group.outputs)
        return (f"exit codes {group.returncodes}, "
                f"{len(group.results)}/{expected_results} results: "
                f"{failure_reason(output)}")
    return None
