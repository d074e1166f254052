# load_model: keras.models.load_model that hands back a model whose
# optimizer averages gradients across ranks.
#
# Why: a checkpoint written by one run (with a tfring DistributedOptimizer
# or with a plain optimizer) is the starting point of the next distributed
# run. Loading registers nothing by hand and keeps the optimizer state that
# was saved (slots, iterations, loss scale): the loaded optimizer object
# becomes the wrapper's inner optimizer.

import keras

from tfring.compression import Compression
from tfring.keras.optimizer import DistributedOptimizer


def load_model(filepath, custom_objects=None, compression=None,
               custom_optimizers=None, compile=True, safe_mode=True):
    """Loads a `.keras` model; its optimizer comes back distributed.

    A file saved with a tfring DistributedOptimizer loads as it was saved
    (with `compression` replacing the saved one); a file saved with a plain
    optimizer (or a LossScaleOptimizer, in mixed precision) comes back with
    that optimizer, state included, wrapped in a DistributedOptimizer, and
    the model is compiled again with its saved loss and metrics.

    Args:
      filepath: path of the `.keras` file (every rank reads it).
      custom_objects: as for keras.models.load_model (your own layers,
        losses, optimizers); tfring's classes need no entry.
      compression: the gradients' compressor (tfring.Compression.none,
        .fp16, .bf16_wire, .fp16_wire, or a tfring.PowerSGD). None (the
        default) keeps the one the file was saved with, a PowerSGD's state
        included (none for a file saved with a plain optimizer).
      custom_optimizers: horovod.keras compatibility: a list of your own
        optimizer classes, added to custom_objects under their class names
        (every optimizer is wrapped, listed or not).
      compile: as for keras.models.load_model. With compile=False the
        model has no optimizer to wrap.
      safe_mode: as for keras.models.load_model.

    Returns:
      The keras Model.
    """
    if custom_optimizers:
        custom_objects = dict(custom_objects or {})
        for cls in custom_optimizers:
            custom_objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=custom_objects,
                                    compile=compile, safe_mode=safe_mode)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return model
    if isinstance(optimizer, DistributedOptimizer):
        if compression is not None:
            optimizer._set_compression(compression)
        return model
    distributed = DistributedOptimizer(
        optimizer, compression=Compression.none if compression is None else compression)
    # Compile again with the saved loss and metrics, so that the compile
    # config (what a later model.save() writes) names the wrapper too.
    config = dict(model.get_compile_config())
    config.pop("optimizer", None)
    config = keras.saving.deserialize_keras_object(
        config, custom_objects=custom_objects)
    model.compile(optimizer=distributed, **config)
    if model.built:
        distributed.build(model.trainable_variables)
    return model
