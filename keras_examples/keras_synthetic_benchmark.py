"""Synthetic-data training throughput of Keras model.fit, on one rank or many.

A plain single-process `model.compile` + `model.fit` program made distributed
with tfring; every line that tfring adds or changes ends with `# tfring:`.

    tfringrun -np 2 python keras_examples/keras_synthetic_benchmark.py \
        --intra-op-threads 1
    mpirun -np 2 python keras_examples/keras_synthetic_benchmark.py --steps 100

Each rank trains on its own random batch, repeated (no input pipeline cost);
DistributedOptimizer averages the gradients over all ranks every step, so the
job does the work of one process with a batch of size() * --batch-size.
A callback times the steps after the first --warmup-steps of the first epoch
(tracing, the initial broadcast, first allocations), and rank 0 prints
images/sec per rank and in total. Compare the total with the same command at
one rank, or with benchmarks/keras_scaling.py, which does that and more.
"""

import argparse
import time

import keras
import tensorflow as tf

import tfring as hvd  # tfring: the same API as horovod.tensorflow
import tfring.keras  # tfring: callbacks


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["cnn", "resnet50", "mobilenetv2"],
                        default="cnn",
                        help="a small CNN on 32x32 images (default), or "
                             "keras.applications.ResNet50 / MobileNetV2 "
                             "(weights=None) on 224x224")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per rank per step")
    parser.add_argument("--steps", type=int, default=40,
                        help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs (all timed except the warm-up steps)")
    parser.add_argument("--warmup-steps", type=int, default=5,
                        help="untimed steps at the start of the first epoch")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="TensorFlow intra-op threads per rank (0: "
                             "TensorFlow's default; 1 suits several ranks "
                             "on few cores)")
    args = parser.parse_args()
    if args.warmup_steps < 1 or args.steps * args.epochs <= args.warmup_steps:
        parser.error(f"--warmup-steps must be at least 1 and below --steps x "
                     f"--epochs ({args.steps * args.epochs}); got "
                     f"{args.warmup_steps}")
    return args


def build_model(name, num_classes):
    applications = {"resnet50": keras.applications.ResNet50,
                    "mobilenetv2": keras.applications.MobileNetV2}
    if name in applications:
        return applications[name](
            weights=None, input_shape=(224, 224, 3), classes=num_classes,
            classifier_activation=None)
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes),
    ])


class StepTimer(keras.callbacks.Callback):
    """Times training steps after the first `skip` ones.

    The clock starts when step `skip` ends and stops when the last step
    ends, so it covers whole steps only (epoch boundaries included, which
    without validation cost next to nothing).
    """

    def __init__(self, skip):
        super().__init__()
        self.skip = skip
        self.steps_done = 0
        self.timed_steps = 0
        self.start = self.end = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self.steps_done += 1
        if self.steps_done == self.skip:
            self.start = now
        elif self.steps_done > self.skip:
            self.timed_steps += 1
            self.end = now

    def seconds(self):
        return self.end - self.start


def main():
    args = parse_args()
    if args.intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads)
    hvd.init()  # tfring: start the background thread, join the other ranks

    num_classes = 10 if args.model == "cnn" else 1000
    model = build_model(args.model, num_classes)
    # The global batch is size() times larger, so is the learning rate.
    optimizer = keras.optimizers.SGD(
        learning_rate=0.01 * hvd.size(), momentum=0.9)  # tfring: lr * size
    model.compile(
        optimizer=hvd.DistributedOptimizer(optimizer),  # tfring: average
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    # One random batch, served again and again.
    shape = (args.batch_size,) + tuple(model.input_shape[1:])
    images = tf.random.uniform(shape)
    labels = tf.random.uniform((args.batch_size,), maxval=num_classes,
                               dtype=tf.int64)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()

    timer = StepTimer(skip=args.warmup_steps)
    callbacks = [
        # Every rank starts from rank 0's weights.
        hvd.keras.callbacks.BroadcastGlobalVariablesCallback(0),  # tfring:
        timer,
    ]
    history = model.fit(
        dataset, epochs=args.epochs, steps_per_epoch=args.steps,
        callbacks=callbacks, shuffle=False,  # one batch: nothing to shuffle
        verbose=2 if hvd.rank() == 0 else 0)  # tfring: log on rank 0 only

    per_rank = args.batch_size * timer.timed_steps / timer.seconds()
    rates = hvd.allgather_object(per_rank)  # tfring: every rank's rate
    if hvd.rank() == 0:  # tfring: print once
        ranks = f"{hvd.size()} rank{'s' if hvd.size() > 1 else ''}"  # tfring:
        print(f"Model: {args.model}, batch size {args.batch_size} per rank, "
              f"{ranks}, {timer.timed_steps} timed steps after "
              f"{args.warmup_steps} warm-up steps, final loss "
              f"{history.history['loss'][-1]:.4f}")
        for rank, rate in enumerate(rates):
            print(f"Rank {rank}: {rate:.1f} img/sec")
        print(f"Total img/sec on {len(rates)} ranks: {sum(rates):.1f}")


if __name__ == "__main__":
    main()
