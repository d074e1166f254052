# Higher-level helpers built on the collectives: make every rank start from
# root's variables (broadcast_variables, and Horovod's in-place broadcast_,
# which also returns the new values), and exchange arbitrary picklable
# Python objects.
#
# Why: training starts from one rank's initial weights (or checkpoint), and
# small pieces of Python state (epoch counters, configs, metrics) must be
# shared without each script re-inventing serialisation over tensors.

import collections
import io

import keras
import numpy as np
import tensorflow as tf

from tfring import basics
from tfring import collectives
from tfring import list_agreement
from tfring.process_sets import global_process_set

try:  # cloudpickle also handles lambdas and local classes, like Horovod.
    import cloudpickle as _pickle
except ImportError:
    import pickle as _pickle


def _assign_broadcast(variables, root_rank, process_set, name=None):
    # Variable i is broadcast as `<name>.<i>` when a name is given.
    return tf.group(*[
        v.assign(collectives.broadcast(
            v, root_rank, name=None if name is None else f"{name}.{i}",
            process_set=process_set))
        for i, v in enumerate(variables)])


@tf.autograph.experimental.do_not_convert
def broadcast_variables(variables, root_rank, process_set=global_process_set,
                        inplace=False):
    """Assigns root_rank's values to `variables` on every rank.

    Works eagerly (the broadcasts run together inside one tf.function), inside
    tf.function, and in tf.compat.v1 graphs (returns the op to run). Every
    rank must pass the same variables in the same order. With
    `process_set`, only its ranks take part (and may call this) and
    root_rank is one of its job ranks. `inplace` is accepted for Horovod
    compatibility: tfring always assigns the received values to the
    variables themselves.
    """
    del inplace
    api_name = "tfring.broadcast_variables()"
    basics._check_initialized(api_name)
    membership = collectives.resolve_process_set(process_set, api_name)
    collectives.check_root_rank(root_rank, api_name, membership)
    variables = list(variables)
    if tf.executing_eagerly():
        list_agreement.check_same_length(variables, "variables", "broadcast",
                                         api_name, membership)
        if variables:
            _assign_broadcast_in_function(variables, root_rank, membership)
        return None
    return _assign_broadcast(variables, root_rank, process_set)


# Eager calls run the broadcasts together in one tf.function, kept per list
# of variables, root rank and process set so repeated calls do not trace
# again. (The variables are closed over, not passed: Keras 3 variables are
# not tf.Variables and would arrive in the function as plain tensors.)
_BROADCAST_FUNCTIONS_KEPT = 16
_broadcast_functions = collections.OrderedDict()


def _assign_broadcast_in_function(variables, root_rank, membership,
                                  name=None):
    key = (tuple(id(v) for v in variables), root_rank, membership.key, name)
    entry = _broadcast_functions.pop(key, None)
    if entry is None:
        process_set = membership.process_set

        def assign_all():
            _assign_broadcast(variables, root_rank, process_set, name)

        # The entry holds `variables`, so the ids in `key` stay theirs.
        entry = (tf.function(assign_all, autograph=False), variables)
    _broadcast_functions[key] = entry
    while len(_broadcast_functions) > _BROADCAST_FUNCTIONS_KEPT:
        _broadcast_functions.popitem(last=False)
    entry[0]()


def _check_variables(variables, api_name):
    """`variables` as a list, after checking it holds only variables."""
    not_a_list = TypeError(
        f"{api_name} received `variables` of type "
        f"{type(variables).__name__}. Expected a list or tuple of "
        "variables (tf.Variable or keras.Variable). Pass a list, e.g. "
        "[var].")
    if isinstance(variables, (tf.Variable, keras.Variable, tf.Tensor,
                              str, bytes)):
        raise not_a_list
    try:
        variables = list(variables)
    except TypeError:
        raise not_a_list from None
    for i, v in enumerate(variables):
        if not isinstance(v, (tf.Variable, keras.Variable)):
            raise TypeError(
                f"{api_name} received an object of type "
                f"{type(v).__name__} at position {i} of `variables`. "
                "Expected variables (tf.Variable or keras.Variable): it "
                "assigns root_rank's values to them in place. Use "
                "tfring.broadcast() for tensors.")
    return variables


def _read(variable):
    if isinstance(variable, tf.Variable):
        return variable.read_value()
    return tf.identity(tf.convert_to_tensor(variable))


@tf.autograph.experimental.do_not_convert
def broadcast_(variables, root_rank, name=None,
               process_set=global_process_set):
    """Horovod's in-place broadcast: assigns root_rank's values to
    `variables` on every rank and returns their new values.

    Args:
      variables: a list or tuple of tf.Variable / keras.Variable, the same
        variables (shapes and dtypes) in the same order on every rank.
      root_rank: the rank whose values every rank gets (with
        `process_set`, one of its job ranks).
      name: optional; variable i is broadcast under the name `<name>.<i>`
        (the same on every rank).
      process_set: only its ranks take part (and may call this).

    Returns:
      A list with one tensor per variable: its value after the broadcast
      (eagerly the new values; in tf.function and tf.compat.v1 graphs
      tensors that read the variables after the assignments, so running
      them runs the broadcast), as horovod.tensorflow.broadcast_ returns.
      tfring assigns the broadcast values (the machinery of
      broadcast_variables()) rather than receiving into the variables'
      buffers, so there is no limit on devices or variable kinds.
    """
    api_name = "tfring.broadcast_()"
    variables = _check_variables(variables, api_name)
    basics._check_initialized(api_name)
    membership = collectives.resolve_process_set(process_set, api_name)
    collectives.check_root_rank(root_rank, api_name, membership)
    list_agreement.check_same_length(variables, "variables", "broadcast",
                                     api_name, membership)
    if not variables:
        return []
    if tf.executing_eagerly():
        _assign_broadcast_in_function(variables, root_rank, membership, name)
        return [_read(v) for v in variables]
    assigned = _assign_broadcast(variables, root_rank, process_set, name)
    with tf.control_dependencies([assigned]):
        return [_read(v) for v in variables]


def _to_numpy(tensor, session, api_name):
    if tf.executing_eagerly():
        return tensor.numpy()
    if tf.inside_function():
        raise RuntimeError(
            f"{api_name} was called inside a tf.function. It needs the "
            "values right away to (un)pickle the object. Call it outside "
            "tf.function.")
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise RuntimeError(
            f"{api_name} was called in graph mode without a session. It "
            "needs a tf.compat.v1.Session to run the collectives. Pass "
            "session=sess or call it inside `with sess.as_default():`.")
    return session.run(tensor)


def _dumps(obj):
    buffer = io.BytesIO()
    _pickle.dump(obj, buffer)
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8)


def _loads(byte_array):
    return _pickle.loads(np.asarray(byte_array, dtype=np.uint8).tobytes())


def _names(name, *suffixes):
    return [None if name is None else f"{name}_{s}" for s in suffixes]


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=global_process_set):
    """Returns root_rank's `obj` on every rank (pickled, then broadcast).

    `obj` is ignored on the other ranks. `name`, if given, must be the same
    on every rank. `session` is only for tf.compat.v1 graph mode. With
    `process_set`, only its ranks take part (and may call this) and
    root_rank is one of its job ranks.
    """
    api_name = "tfring.broadcast_object()"
    basics._check_initialized(api_name)
    membership = collectives.resolve_process_set(process_set, api_name)
    root_rank = collectives.check_root_rank(root_rank, api_name, membership)
    size_name, bytes_name = _names(name, "size", "bytes")
    is_root = basics.rank() == root_rank
    payload = _dumps(obj) if is_root else None
    # First the length, so the other ranks can allocate the receive buffer.
    length = np.array([payload.size if is_root else 0], dtype=np.int64)
    length = _to_numpy(
        collectives.broadcast(length, root_rank, name=size_name,
                              process_set=process_set), session, api_name)
    buffer = payload if is_root else np.zeros(int(length[0]), dtype=np.uint8)
    received = _to_numpy(
        collectives.broadcast(buffer, root_rank, name=bytes_name,
                              process_set=process_set), session, api_name)
    return obj if is_root else _loads(received)


def allgather_object(obj, session=None, name=None,
                     process_set=global_process_set):
    """Returns the list of every rank's `obj`, in rank order.

    `name`, if given, must be the same on every rank. `session` is only for
    tf.compat.v1 graph mode. With `process_set`, only its ranks take part
    (and may call this) and the list has one object per rank of the set,
    in the order of their job ranks.
    """
    api_name = "tfring.allgather_object()"
    basics._check_initialized(api_name)
    collectives.resolve_process_set(process_set, api_name)
    size_name, bytes_name = _names(name, "sizes", "bytes")
    payload = _dumps(obj)
    lengths = _to_numpy(
        collectives.allgather(np.array([payload.size], dtype=np.int64),
                              name=size_name, process_set=process_set),
        session, api_name)
    gathered = _to_numpy(
        collectives.allgather(payload, name=bytes_name,
                              process_set=process_set), session, api_name)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [_loads(gathered[offsets[i]:offsets[i + 1]])
            for i in range(len(lengths))]


def broadcast_global_variables(root_rank):
    """tf.compat.v1 graphs: broadcast_variables() of all global variables."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "tfring.broadcast_global_variables() was called eagerly; it is "
            "for tf.compat.v1 graphs, where global variables exist. Use "
            "tfring.broadcast_variables(model.variables, root_rank) "
            "instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)
