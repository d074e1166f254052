# A Keras script in the style of Horovod's Keras MNIST examples (TF1-era
# GPU pinning, Keras 2 arguments), on generated data. Ported by
# python -m tfring.migrate in tests/test_migrate.py, then run at 2 ranks.
import math

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import backend as K
import horovod.tensorflow.keras as hvd

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
config = tf.ConfigProto()
config.gpu_options.allow_growth = True
config.gpu_options.visible_device_list = str(hvd.local_rank())
K.set_session(tf.Session(config=config))

batch_size = 16
num_classes = 4
epochs = 2

rng = np.random.RandomState(hvd.rank())
x_train = rng.rand(96, 8, 8, 1).astype("float32")
y_train = keras.utils.to_categorical(rng.randint(num_classes, size=96), num_classes)

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(4, kernel_size=(3, 3), activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(num_classes, activation="softmax"),
])

# Horovod: adjust learning rate based on number of GPUs.
opt = keras.optimizers.Adadelta(lr=1.0 * hvd.size())

# Horovod: add Horovod Distributed Optimizer.
opt = hvd.DistributedOptimizer(opt)

model.compile(loss=keras.losses.categorical_crossentropy,
              optimizer=opt,
              metrics=["accuracy"],
              experimental_run_tf_function=False)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=1.0 * hvd.size(), warmup_epochs=1, verbose=0),
]

datagen = keras.preprocessing.image.ImageDataGenerator(width_shift_range=0.1)
model.fit_generator(datagen.flow(x_train, y_train, batch_size=batch_size),
                    steps_per_epoch=int(math.ceil(96 / batch_size)) // hvd.size(),
                    callbacks=callbacks,
                    epochs=epochs,
                    verbose=0)
score = model.evaluate(x_train, y_train, verbose=0)
weights = hvd.allgather(np.concatenate([w.ravel() for w in model.get_weights()])[None])
assert np.allclose(weights[0], weights[-1]), "ranks ended with different weights"
print(f"rank {hvd.rank()} PORTED_SCRIPT_DONE loss={score[0]:.4f}", flush=True)
