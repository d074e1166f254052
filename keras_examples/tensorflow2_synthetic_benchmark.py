"""Synthetic-data training throughput of a Keras model, on one rank or many.

A plain single-process Keras custom training loop made distributed with
tfring; every line that tfring adds or changes ends with `# tfring:`.

    tfringrun -np 2 python keras_examples/tensorflow2_synthetic_benchmark.py --steps 10
    mpirun -np 2 python keras_examples/tensorflow2_synthetic_benchmark.py --model resnet50

Each rank trains on its own synthetic batch; gradients are averaged over all
ranks every step, so the job behaves like one process with a batch of
size() * --batch-size. Rank 0 prints images/sec per rank and in total.
"""

import argparse
import time

import keras
import tensorflow as tf

import tfring as hvd  # tfring: the same API as horovod.tensorflow


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["cnn", "resnet50"], default="cnn",
                        help="a small CNN (default) or keras.applications."
                             "ResNet50(weights=None)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per rank per step")
    parser.add_argument("--steps", type=int, default=20,
                        help="timed training steps")
    parser.add_argument("--warmup-steps", type=int, default=3,
                        help="untimed steps first (tracing, first "
                             "allocations)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="image height and width (default: 32 for cnn, "
                             "224 for resnet50)")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="TensorFlow intra-op threads per rank (0: "
                             "TensorFlow's default; 1 suits several ranks "
                             "on few cores)")
    return parser.parse_args()


def build_model(name, image_size, num_classes):
    shape = (image_size, image_size, 3)
    if name == "resnet50":
        return keras.applications.ResNet50(
            weights=None, input_shape=shape, classes=num_classes,
            classifier_activation=None)
    return keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes),
    ])


def main():
    args = parse_args()
    if args.intra_op_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads)
    hvd.init()  # tfring: start the background thread, join the other ranks

    image_size = args.image_size or (224 if args.model == "resnet50" else 32)
    num_classes = 1000 if args.model == "resnet50" else 10
    model = build_model(args.model, image_size, num_classes)
    # Scale the learning rate with the number of ranks: the global batch is
    # size() times larger.
    optimizer = keras.optimizers.SGD(
        learning_rate=0.01 * hvd.size(), momentum=0.9)  # tfring: lr * size
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    images = tf.random.uniform((args.batch_size, image_size, image_size, 3))
    labels = tf.random.uniform((args.batch_size,), maxval=num_classes,
                               dtype=tf.int64)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)  # tfring: average gradients
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # The first step creates the optimizer's variables; then every rank
    # takes rank 0's model and optimizer state, so all start identical.
    train_step()
    hvd.broadcast_variables(model.variables, root_rank=0)  # tfring: sync start
    hvd.broadcast_variables(optimizer.variables,  # tfring: sync start
                            root_rank=0)

    for _ in range(max(args.warmup_steps - 1, 0)):
        train_step()
    float(train_step())

    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step()
    float(loss)  # wait for the last step to finish
    seconds = time.perf_counter() - start

    per_rank = args.batch_size * args.steps / seconds
    rates = hvd.allgather_object(per_rank)  # tfring: collect every rank's rate
    if hvd.rank() == 0:  # tfring: print once
        print(f"Model: {args.model}, batch size {args.batch_size} per rank, "
              f"{hvd.size()} ranks, {args.steps} timed steps, "  # tfring: size
              f"loss {float(loss):.4f}")
        for rank, rate in enumerate(rates):
            print(f"Rank {rank}: {rate:.1f} img/sec")
        print(f"Total img/sec on {len(rates)} ranks: {sum(rates):.1f}")


if __name__ == "__main__":
    main()
