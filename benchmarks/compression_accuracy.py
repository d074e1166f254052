"""Training to accuracy with each gradient compression, across namespace
hosts: does compressing what crosses hosts cost accuracy, and how long does
each method take to reach a target?

    python benchmarks/compression_accuracy.py                  # 2 hosts x 2 ranks, 1 Gbit/s
    python benchmarks/compression_accuracy.py --epochs 4 --seeds 0   # a quick check
    python benchmarks/compression_accuracy.py --hosts 4 --ranks-per-host 1 --link-rate 10gbit

This machine plays the hosts (benchmarks/_namespace_hosts.py: network
namespaces with token-bucket links). Needs root. One job trains two models
with Keras `fit` and tfring.keras.DistributedOptimizer, once per method,
each run from the same initial weights, data order and learning-rate
schedule (warm-up to 0.02 x ranks over 2 epochs, a tenfold drop for the
last 30% of the epochs, SGD with momentum 0.9):

  * digits: keras_examples/keras_digits.py's CNN on scikit-learn's 8x8
    digits (1437 training and 360 held-out images);
  * shapes: a small CNN on generated CIFAR-shaped data (32x32x3, 10
    classes): each class is a blocky random colour pattern, each image one
    of them shifted by up to 3 pixels each way under strong Gaussian
    noise, so a model must learn the patterns to get far above chance.

Methods: fp32 (Compression.none), bf16 and fp16 wire compression, and
PowerSGD (ranks 4 and 16, after 10 uncompressed steps, as DDP's
start_powerSGD_iter). One run per seed and method: one run's accuracy
moves by a point or two with the seed alone, so the report gives the mean
over the seeds and each method's difference from fp32 paired by seed.
The job runs on the hierarchical path (TFRING_HIERARCHICAL_ALLREDUCE=1), where
wire compression encodes only what crosses hosts. Reported per model and
method: the final held-out accuracy (the mean of the last two epochs'
accuracy over all ranks' shards of the held-out images), its
difference from fp32's in percentage points, the time of the first epoch
end at or above the model's target accuracy, and the whole fit's time.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _namespace_hosts  # noqa: E402

METHODS = ("fp32", "bf16 wire", "fp16 wire", "PowerSGD r=4", "PowerSGD r=16")
TARGETS = {"digits": 0.95, "shapes": 0.90}
BATCH = 32


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _namespace_hosts.add_arguments(parser)
    parser.add_argument("--epochs", type=int, default=10,
                        help="epochs per training run (default 10)")
    parser.add_argument("--seeds", default="0,1,2",
                        help="seeds of the data, the split, the initial weights and the data "
                             "order, one training run per seed and method (default 0,1,2)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of: {', '.join(METHODS)}")
    parser.add_argument("--models", default="digits,shapes",
                        help="comma-separated subset of: digits, shapes")
    parser.add_argument("--json", help="also write every run's per-epoch accuracy and "
                                       "time to this file")
    parser.add_argument("--timeout", type=float, default=1200,
                        help="seconds the job may take before it is stopped")
    parser.add_argument("--results-file", help="(worker) where rank 0 writes its results")
    return parser.parse_args(argv)


# ------------------------------------------------------------------ data --

def shapes_data(seed, train=2560, held_out=640):
    """((x_train, y_train), (x_val, y_val)) of the generated CIFAR-shaped
    task; the same on every rank."""
    import numpy as np
    rng = np.random.default_rng(seed)
    patterns = np.kron(rng.normal(size=(10, 8, 8, 3)), np.ones((1, 4, 4, 1)))
    count = train + held_out
    labels = rng.integers(0, 10, count)
    shifts = rng.integers(-3, 4, size=(count, 2))
    images = np.stack([np.roll(patterns[c], tuple(s), axis=(0, 1))
                       for c, s in zip(labels, shifts)])
    images += rng.normal(scale=4.0, size=images.shape)
    images = (images / 4.0).astype("float32")
    return ((images[:train], labels[:train].astype("int64")),
            (images[train:], labels[train:].astype("int64")))


def shapes_model():
    import keras
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def tasks(seed):
    sys.path.insert(0, os.path.join(ROOT, "keras_examples"))
    import keras_digits
    return {"digits": (keras_digits.load_split(0.2, seed), keras_digits.build_model),
            "shapes": (shapes_data(seed), shapes_model)}


# ---------------------------------------------------------------- worker --

def compression_of(method, hvd):
    return {"fp32": hvd.Compression.none,
            "bf16 wire": hvd.Compression.bf16_wire,
            "fp16 wire": hvd.Compression.fp16_wire}.get(method) or hvd.PowerSGD(
                rank=int(method.split("r=")[1]), start_iter=10)


def train_once(hvd, data, build_model, method, seed, args):
    """One fit of `build_model` on `data` with `method`; (final held-out
    accuracy, [(seconds, accuracy) at each epoch end]). The learning rate
    drops tenfold for the last 30% of the epochs, so the runs settle."""
    import keras
    import tensorflow as tf
    (x_train, y_train), (x_val, y_val) = data
    keras.utils.set_random_seed(seed)
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
             .shard(hvd.size(), hvd.rank())
             .shuffle(len(x_train), seed=seed + hvd.rank())
             .repeat().batch(BATCH, drop_remainder=True))
    steps = max(1, len(x_train) // hvd.size() // BATCH)
    validation = (tf.data.Dataset.from_tensor_slices((x_val, y_val))
                  .shard(hvd.size(), hvd.rank()).batch(BATCH))
    scaled_lr = 0.02 * hvd.size()
    optimizer = hvd.keras.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9),
        compression=compression_of(method, hvd))
    model = build_model()
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    epochs = []

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            epochs.append((time.perf_counter() - started, float(logs["val_accuracy"])))

    decay_from = max(3, int(0.7 * args.epochs))
    callbacks = [hvd.keras.callbacks.MetricAverageCallback(),
                 hvd.keras.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.keras.callbacks.LearningRateWarmupCallback(
                     initial_lr=scaled_lr, warmup_epochs=2, verbose=0),
                 hvd.keras.callbacks.LearningRateScheduleCallback(
                     initial_lr=scaled_lr, multiplier=0.1, start_epoch=decay_from),
                 EpochTimes()]
    started = time.perf_counter()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, validation_data=validation,
              callbacks=callbacks, shuffle=False, verbose=0)
    # The last two epochs' mean: one epoch's accuracy still moves by a
    # point or two from the next on these small held-out sets.
    return sum(accuracy for _, accuracy in epochs[-2:]) / len(epochs[-2:]), epochs


def worker(args):
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")  # each run's new model retraces tfring's broadcast
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tfring as hvd
    import tfring.keras  # noqa: F401 (hvd.keras)
    hvd.init()
    results = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for task, (data, build_model) in tasks(seed).items():
            if task not in args.models.split(","):
                continue
            for method in args.methods.split(","):
                final, epochs = train_once(hvd, data, build_model, method, seed, args)
                results[f"{task} | {method} | {seed}"] = {"final": final, "epochs": epochs}
                if hvd.rank() == 0:
                    print(f"  seed {seed}, {task}, {method}: final held-out accuracy "
                          f"{final:.4f}", flush=True)
                    with open(args.results_file, "w") as f:
                        json.dump(results, f)


# ---------------------------------------------------------- orchestrator --

def orchestrate(args):
    started = time.time()
    env = {"TFRING_HIERARCHICAL_ALLREDUCE": "1", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with _namespace_hosts.namespace_hosts(args) as hosts, \
            tempfile.TemporaryDirectory(prefix="tfring-accuracy-") as scratch:
        results_file = os.path.join(scratch, "results.json")
        try:
            finished = _namespace_hosts.run_workers(
                hosts, args, __file__,
                ["--epochs", str(args.epochs), "--seeds", args.seeds,
                 "--methods", args.methods, "--models", args.models,
                 "--results-file", results_file], extra_env=env, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            finished = None
        if not os.path.exists(results_file):
            raise SystemExit("the training job wrote no result (exit "
                             f"{'timeout' if finished is None else finished.returncode}); "
                             "its output is above")
        with open(results_file) as f:
            results = json.load(f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"\n{args.hosts} hosts x {args.ranks_per_host} ranks, links {args.link_rate}, "
          f"{socket.gethostname()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.epochs} epochs per run, seeds {args.seeds}, {time.time() - started:.0f} s in all")
    report(results)


def report(results):
    """One row per model and method: the mean over the seeds of the final
    accuracy, of its difference from fp32's with the same seed (and the
    range of that difference), of the time to the target and of the fit."""
    import numpy as np
    runs = {}
    for key, result in results.items():
        task, method, seed = key.split(" | ")
        runs.setdefault((task, method), {})[seed] = result
    print("| model | method | final accuracy (mean) | vs fp32, points: mean (range) "
          "| time to target (mean) | fit time (mean) |")
    print("|---|---|---:|---:|---:|---:|")
    for (task, method), by_seed in runs.items():
        baseline = runs.get((task, "fp32"), {})
        paired = [100 * (r["final"] - baseline[seed]["final"])
                  for seed, r in by_seed.items() if seed in baseline]
        reached = [next((t for t, accuracy in r["epochs"] if accuracy >= TARGETS[task]), None)
                   for r in by_seed.values()]
        to_target = (f"{np.mean(reached):.1f} s" if None not in reached
                     else f"{reached.count(None)} of {len(reached)} runs never")
        versus = (f"{np.mean(paired):+.1f} ({min(paired):+.1f} to {max(paired):+.1f})"
                  if paired else "no fp32 run")
        print(f"| {task} (target {TARGETS[task]:.2f}) | {method} | "
              f"{np.mean([r['final'] for r in by_seed.values()]):.4f} | {versus} | "
              f"{to_target} | {np.mean([r['epochs'][-1][0] for r in by_seed.values()]):.1f} s |")
    print(f"({len(results)} training runs)")


if __name__ == "__main__":
    _namespace_hosts.main(parse_args, worker, orchestrate)
