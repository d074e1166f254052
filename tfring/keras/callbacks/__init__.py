# tfring.keras.callbacks: Keras 3 callbacks for data-parallel training, with
# horovod.tensorflow.keras.callbacks' names and arguments. One callback per
# module; this file only re-exports.

from tfring.keras.callbacks.best_model_checkpoint import BestModelCheckpoint
from tfring.keras.callbacks.broadcast_global_variables import (
    BroadcastGlobalVariablesCallback)
from tfring.keras.callbacks.learning_rate_schedule import (
    LearningRateScheduleCallback)
from tfring.keras.callbacks.learning_rate_warmup import (
    LearningRateWarmupCallback)
from tfring.keras.callbacks.metric_average import MetricAverageCallback
from tfring.keras.callbacks.join_uneven_data import JoinUnevenDataCallback
