# A TensorFlow 2 custom-loop script in the style of Horovod's
# tensorflow2_mnist example (GradientTape, broadcast after the first step,
# opt.variables() as in Keras 2), launched through horovod.run as some
# Horovod scripts are, on generated data.
import numpy as np
import tensorflow as tf
import horovod
import horovod.tensorflow as hvd


def main(steps):
    # Horovod: initialize Horovod.
    hvd.init()

    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    rng = np.random.RandomState(1 + hvd.rank())
    images = rng.rand(64, 6, 6).astype("float32")
    labels = rng.randint(3, size=64).astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(8)

    model = tf.keras.Sequential([
        tf.keras.Input((6, 6)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(3),
    ])
    loss = tf.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.optimizers.Adam(lr=0.001 * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)

        return loss_value

    for batch, (images, labels) in enumerate(dataset.take(steps)):
        loss_value = training_step(images, labels, batch == 0)

    weights = hvd.allgather(tf.concat([tf.reshape(w, [1, -1]) for w in model.trainable_variables], 1))
    assert np.allclose(weights[0], weights[-1]), "ranks ended with different weights"
    print(f"rank {hvd.rank()} PORTED_SCRIPT_DONE loss={float(loss_value):.4f}", flush=True)


if __name__ == "__main__":
    horovod.run(main, args=(6,), np=2)
