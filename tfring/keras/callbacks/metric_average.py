# MetricAverageCallback: replaces each rank's epoch metrics by their mean over
# all ranks, in the `logs` dict itself, so every callback after it (History,
# ReduceLROnPlateau, EarlyStopping, ModelCheckpoint, TensorBoard) sees the
# same numbers on every rank.
#
# Why one allgather instead of an allreduce per metric: every rank receives
# all ranks' values, so it can first check that all ranks report the same
# metric names (a rank without validation data would otherwise leave the
# others waiting for a reduction that never comes) and then average them in
# the same order, giving bit-identical results everywhere. The payload is a
# few numbers once per epoch.

import numbers

import keras
import numpy as np

from tfring import basics
from tfring import collectives
from tfring import functions
from tfring.process_sets import global_process_set


def _numeric_value(value):
    """`value` as a float64 array if it is a number or numeric array."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Real):
        return np.asarray(value, dtype=np.float64)
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        try:
            array = np.asarray(value.numpy() if hasattr(value, "numpy")
                               else value)
        except (TypeError, ValueError):
            return None
        if array.dtype.kind in "iuf":
            return array.astype(np.float64)
    return None


def _like(original, mean):
    """The averaged value in the original's form (Python float or array)."""
    if mean.ndim == 0 and not isinstance(original, np.ndarray):
        return float(mean)
    dtype = getattr(original, "dtype", None)
    if dtype is not None and np.dtype(dtype).kind == "f":
        return mean.astype(dtype)
    return mean


def _describe_mismatch(gathered, ranks):
    """Which ranks reported which metric names/shapes (`ranks`: the job
    rank of each entry of `gathered`)."""
    by_signature = {}
    for rank, values in zip(ranks, gathered):
        signature = tuple((k, v.shape) for k, v in values)
        by_signature.setdefault(signature, []).append(rank)
    return "; ".join(
        f"ranks {ranks}: " + ", ".join(
            f"{k}{'' if shape == () else list(shape)}" for k, shape in sig)
        for sig, ranks in by_signature.items())


class MetricAverageCallback(keras.callbacks.Callback):
    """Averages the epoch metrics (`loss`, `val_loss`, ...) over all ranks.

    At the end of every epoch each numeric entry of `logs` (training and
    `val_` metrics, and any number an earlier callback added) is replaced by
    its mean over the ranks, in place. Entries that are not numbers are left
    alone. Every rank must report the same metric names; if they differ, every
    rank raises a ValueError listing which ranks reported what.

    Put it first in the callbacks list: Keras runs callbacks in list order,
    so callbacks after it read the averaged values (Keras' own History and
    progress bar always come last). Per-batch logs are not averaged.

    Args:
        device: accepted for Horovod compatibility and ignored.
        process_set: average over the ranks of this tfring.ProcessSet only
            (default: every rank); only its ranks may use the callback.

    Example:

    ```python
    callbacks = [tfring.keras.callbacks.MetricAverageCallback(),
                 keras.callbacks.ReduceLROnPlateau(patience=2)]
    model.fit(x, y, validation_data=(x_val, y_val), callbacks=callbacks)
    ```
    """

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.device = device
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        api_name = "MetricAverageCallback"
        basics._check_initialized(api_name)
        membership = collectives.resolve_process_set(self.process_set,
                                                     api_name)
        logs = {} if logs is None else logs
        local = []
        for key in sorted(logs):
            value = _numeric_value(logs[key])
            if value is not None:
                local.append((key, value))
        gathered = functions.allgather_object(
            local, name="tfring.keras.MetricAverageCallback",
            process_set=self.process_set)
        signature = [(k, v.shape) for k, v in local]
        if any([(k, v.shape) for k, v in values] != signature
               for values in gathered):
            raise ValueError(
                f"{api_name} at the end of epoch {epoch + 1}: the ranks "
                "reported different metrics, so they cannot be averaged ("
                f"{_describe_mismatch(gathered, membership.ranks)}). Expected every rank to "
                "report the same metric names and shapes. Give every rank "
                "the same compile() metrics and validation data (each rank "
                "its own shard of it), and make callbacks that add entries "
                "to logs do so on every rank.")
        for index, (key, _) in enumerate(local):
            total = gathered[0][index][1].copy()
            for values in gathered[1:]:
                total = total + values[index][1]
            logs[key] = _like(logs[key], total / len(gathered))
