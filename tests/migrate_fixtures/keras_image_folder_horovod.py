# A Keras script in the style of Horovod's Keras ImageNet example: images
# read from class folders by ImageDataGenerator.flow_from_directory, a
# model rebuilt from its config with L2 regularizers, the epoch to resume
# from broadcast, learning-rate warm-up and schedule callbacks, Keras 2
# generator calls with worker arguments. Its images are generated into a
# temporary folder. Ported by python -m tfring.migrate in
# tests/test_migrate.py, then run at 2 ranks.
import os
import tempfile

import keras
from keras import backend as K
from keras.preprocessing import image
import numpy as np
import tensorflow as tf
import horovod.keras as hvd

hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
config = tf.ConfigProto()
config.gpu_options.allow_growth = True
config.gpu_options.visible_device_list = str(hvd.local_rank())
K.set_session(tf.Session(config=config))

num_classes = 3
data_dir = tempfile.mkdtemp(prefix=f"image_folder_rank{hvd.rank()}_")
rng = np.random.RandomState(hvd.rank())
for split, per_class in (("train", 4), ("val", 2)):
    for label in range(num_classes):
        folder = os.path.join(data_dir, split, f"class{label}")
        os.makedirs(folder)
        for index in range(per_class):
            pixels = rng.randint(0, 256, size=(16, 16, 3)).astype("uint8")
            keras.utils.save_img(os.path.join(folder, f"{index}.png"), pixels)

checkpoint_format = os.path.join(data_dir, "checkpoint-{epoch}.h5")
resume_from_epoch = 0
for try_epoch in range(2, 0, -1):
    if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
        resume_from_epoch = try_epoch
        break
# Horovod: broadcast resume_from_epoch from rank 0 to the other ranks.
resume_from_epoch = hvd.broadcast(resume_from_epoch, 0, name='resume_from_epoch')

train_gen = image.ImageDataGenerator(horizontal_flip=True, rescale=1. / 255)
train_iter = train_gen.flow_from_directory(os.path.join(data_dir, "train"),
                                           batch_size=2, target_size=(16, 16))
test_gen = image.ImageDataGenerator(rescale=1. / 255)
test_iter = test_gen.flow_from_directory(os.path.join(data_dir, "val"),
                                         batch_size=2, target_size=(16, 16))

model = keras.Sequential([
    keras.Input((16, 16, 3)),
    keras.layers.Conv2D(4, 3, activation="relu"),
    keras.layers.BatchNormalization(),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(num_classes, activation="softmax"),
])
model_config = model.get_config()
for layer, layer_config in zip(model.layers, model_config['layers'][1:]):
    if hasattr(layer, 'kernel_regularizer'):
        regularizer = keras.regularizers.l2(1e-5)
        layer_config['config']['kernel_regularizer'] = \
            {'class_name': regularizer.__class__.__name__,
             'config': regularizer.get_config()}
model = keras.models.Sequential.from_config(model_config)

initial_lr = 0.01 * hvd.size()
opt = keras.optimizers.SGD(lr=initial_lr, momentum=0.9)
opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.none)
model.compile(loss=keras.losses.categorical_crossentropy, optimizer=opt,
              metrics=['accuracy', 'top_k_categorical_accuracy'])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=1, verbose=0),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-1, start_epoch=1),
]
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))

model.fit_generator(train_iter,
                    steps_per_epoch=len(train_iter) // hvd.size(),
                    callbacks=callbacks,
                    epochs=2,
                    verbose=0,
                    workers=2,
                    initial_epoch=resume_from_epoch,
                    validation_data=test_iter,
                    validation_steps=len(test_iter) // hvd.size())

score = hvd.allreduce(model.evaluate_generator(test_iter, len(test_iter), workers=2))
# (BatchNormalization's moving statistics are each rank's own.)
trained = np.concatenate([np.ravel(w) for w in model.trainable_weights])
weights = hvd.allgather(trained[None])
assert np.allclose(weights[0], weights[-1]), "ranks ended with different weights"
print(f"rank {hvd.rank()} PORTED_SCRIPT_DONE loss={float(score[0]):.4f}", flush=True)
