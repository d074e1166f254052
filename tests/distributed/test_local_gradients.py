# Local gradients at any number of ranks, with Horovod 0.28's semantics:
# DistributedGradientTape.register_local_source(),
# get_local_and_global_gradients() and PartialDistributedGradientTape;
# the Keras DistributedOptimizer's register_local_var() (custom loops,
# backward_passes_per_step, model.fit, mixed precision) and
# PartialDistributedOptimizer; scale_local_gradients; process sets; errors.
#
# Why these checks: every rank's data differs, so every rank's gradient
# differs. A local gradient must equal this rank's own gradient divided by
# the process set's size (Horovod divides by it, whatever the op; with
# scale_local_gradients=False it is left as is), never a reduced value; the
# other gradients must be the average. Expected values are rebuilt here by
# computing every rank's gradient in this process.

import contextlib
import inspect
import warnings

import numpy as np
import pytest
import tensorflow as tf
import keras
from mpi4py import MPI

import tfring
import tfring.keras as hvd_keras

MODES = ["eager", "function"]
WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()
TOL = dict(rtol=1e-5, atol=1e-6)


def _run(fn, mode, *args):
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def _data(rank, rows=8):
    rng = np.random.default_rng(900 + rank)
    x = rng.normal(size=(rows, 3)).astype(np.float32)
    y = rng.normal(size=(rows, 1)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def _variables():
    return (tf.Variable([[0.5], [-1.0], [2.0]], name="w"),
            tf.Variable([0.1], name="b"))


def _loss(w, b, x, y):
    return tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)


def _own_grads(rank):
    """Rank `rank`'s local gradients for (w, b), computed here."""
    w, b = _variables()
    x, y = _data(rank)
    with tf.GradientTape() as tape:
        loss = _loss(w, b, x, y)
    return [g.numpy() for g in tape.gradient(loss, [w, b])]


def _mean_grads(ranks):
    per_rank = [_own_grads(r) for r in ranks]
    return [np.mean([g[i] for g in per_rank], axis=0) for i in range(2)]


# --- DistributedGradientTape.register_local_source ------------------------


def _tape_grads(mode, register=True, **kwargs):
    w, b = _variables()
    x, y = _data(ME)

    def step():
        with tf.GradientTape() as tape:
            loss = _loss(w, b, x, y)
        tape = tfring.DistributedGradientTape(tape, **kwargs)
        if register:
            tape.register_local_source(w)
        return tape.gradient(loss, [w, b])

    return [g.numpy() for g in _run(step, mode)]


@pytest.mark.parametrize("mode", MODES)
def test_local_source_keeps_its_own_gradient_divided_by_size(mode):
    gw, gb = _tape_grads(mode)
    own_w, _ = _own_grads(ME)
    _, mean_b = _mean_grads(range(N))
    np.testing.assert_allclose(gw, own_w / N, **TOL)
    np.testing.assert_allclose(gb, mean_b, **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_scale_local_gradients_false_leaves_it_as_computed(mode):
    gw, gb = _tape_grads(mode, scale_local_gradients=False)
    np.testing.assert_allclose(gw, _own_grads(ME)[0], **TOL)
    np.testing.assert_allclose(gb, _mean_grads(range(N))[1], **TOL)


def test_local_gradient_is_divided_by_size_whatever_the_op():
    # Horovod scales local gradients by 1/size for every op (e.g. Sum).
    gw, gb = _tape_grads("eager", op=tfring.Sum)
    np.testing.assert_allclose(gw, _own_grads(ME)[0] / N, **TOL)
    np.testing.assert_allclose(
        gb, np.sum([_own_grads(r)[1] for r in range(N)], axis=0), **TOL)


@pytest.mark.parametrize("kwargs", [
    dict(groups=2), dict(gradient_predivide_factor=2.0),
    dict(sparse_as_dense=True)])
def test_options_reduce_only_the_global_gradients(kwargs):
    gw, gb = _tape_grads("eager", **kwargs)
    np.testing.assert_allclose(gw, _own_grads(ME)[0] / N, **TOL)
    np.testing.assert_allclose(gb, _mean_grads(range(N))[1], **TOL)


def test_groups_as_lists_may_name_a_local_variable():
    w, b = _variables()
    x, y = _data(ME)
    with tf.GradientTape() as tape:
        loss = _loss(w, b, x, y)
    tape = tfring.DistributedGradientTape(tape, groups=[[w, b]])
    tape.register_local_source(w)
    gw, gb = tape.gradient(loss, [w, b])
    np.testing.assert_allclose(gw, _own_grads(ME)[0] / N, **TOL)
    np.testing.assert_allclose(gb, _mean_grads(range(N))[1], **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_every_source_local_runs_no_collective(mode):
    w, b = _variables()
    x, y = _data(ME)

    def step():
        with tf.GradientTape() as tape:
            loss = _loss(w, b, x, y)
        tape = tfring.DistributedGradientTape(tape)
        tape.register_local_source(w)
        tape.register_local_source(b)
        return tape.gradient(loss, [w, b])

    if ME == 0:  # Only one rank: a collective here would hang the job.
        grads = _run(step, mode)
        for got, want in zip(grads, _own_grads(0)):
            np.testing.assert_allclose(got, want / N, **TOL)
    WORLD.Barrier()


@pytest.mark.parametrize("mode", MODES)
def test_get_local_and_global_gradients(mode):
    w, b = _variables()
    unused = tf.Variable([3.0])
    x, y = _data(ME)

    sources = []  # (local, global) sources, seen while tracing

    def step():
        with tf.GradientTape() as tape:
            loss = _loss(w, b, x, y)
        tape = tfring.DistributedGradientTape(tape)
        tape.register_local_source(w)
        local_pairs, global_pairs = tape.get_local_and_global_gradients(
            loss, [b, w, unused])
        sources.append(([s for s, _ in local_pairs],
                        [s for s, _ in global_pairs]))
        return ([g for _, g in local_pairs], [g for _, g in global_pairs])

    local_grads, global_grads = _run(step, mode)
    local_sources, global_sources = sources[0]
    assert len(local_sources) == 1 and local_sources[0] is w
    assert len(global_sources) == 2
    assert global_sources[0] is b and global_sources[1] is unused
    np.testing.assert_allclose(local_grads[0], _own_grads(ME)[0] / N, **TOL)
    np.testing.assert_allclose(global_grads[0], _mean_grads(range(N))[1],
                               **TOL)
    assert global_grads[1] is None


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_local_indexed_slices_stay_local_and_sparse(sparse_as_dense):
    # As in Horovod: a local IndexedSlices keeps its type (values divided
    # by size); sparse_as_dense only densifies what is reduced.
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    shared = tf.Variable(np.ones((6, 2), dtype=np.float32))
    ids = tf.constant([ME % 6, 5])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, ids) * float(ME + 1)
                             + tf.gather(shared, ids) * float(ME + 1))
    tape = tfring.DistributedGradientTape(tape,
                                          sparse_as_dense=sparse_as_dense)
    tape.register_local_source(table)
    g_table, g_shared = tape.gradient(loss, [table, shared])
    assert isinstance(g_table, tf.IndexedSlices)
    np.testing.assert_array_equal(g_table.indices, [ME % 6, 5])
    np.testing.assert_allclose(g_table.values,
                               np.full((2, 2), (ME + 1) / N), **TOL)
    assert isinstance(g_shared, tf.IndexedSlices) != sparse_as_dense
    dense = np.zeros((6, 2), np.float32)
    for r in range(N):
        dense[r % 6] += (r + 1) / N
        dense[5] += (r + 1) / N
    np.testing.assert_allclose(tf.convert_to_tensor(g_shared), dense, **TOL)


def test_keras_variable_and_its_tf_variable_are_the_same_source():
    layer = keras.layers.Dense(1, use_bias=False,
                               kernel_initializer=keras.initializers.Ones())
    layer.build((None, 3))
    x, y = _data(ME)
    for register, ask in [(layer.kernel, layer.kernel.value),
                          (layer.kernel.value, layer.kernel)]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((layer(x) - y) ** 2)
        own = tape.gradient(loss, layer.kernel.value)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((layer(x) - y) ** 2)
        tape = tfring.DistributedGradientTape(tape)
        tape.register_local_source(register)
        (grad,) = tape.gradient(loss, [ask])
        np.testing.assert_allclose(grad, own.numpy() / N, **TOL)


def test_watched_tensor_as_local_source():
    x = tf.constant([1.0, 2.0]) * float(ME + 1)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(x * x)
    tape = tfring.DistributedGradientTape(tape)
    tape.register_local_source(x)
    (grad,) = tape.gradient(loss, [x])
    np.testing.assert_allclose(grad, 2 * x.numpy() / N, **TOL)


# --- PartialDistributedGradientTape --------------------------------------


def _model():
    """The same small model on every rank (weights from a fixed seed)."""
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    rng = np.random.default_rng(42)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def _model_grads(model, rank):
    x, y = _data(rank)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    return [g.numpy() for g in tape.gradient(loss,
                                             model.trainable_variables)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_local", [0, 1, 2])
def test_partial_tape_keeps_the_local_layers_gradients(mode, num_local):
    model = _model()
    local_layers = model.layers[:num_local]
    x, y = _data(ME)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        tape = tfring.PartialDistributedGradientTape(
            tape, local_layers=local_layers)
        return tape.gradient(loss, model.trainable_variables)

    grads = _run(step, mode)
    per_rank = [_model_grads(model, r) for r in range(N)]
    local_ids = {id(v) for layer in local_layers
                 for v in layer.trainable_variables}
    for i, (v, g) in enumerate(zip(model.trainable_variables, grads)):
        if id(v) in local_ids:
            want = per_rank[ME][i] / N
        else:
            want = np.mean([p[i] for p in per_rank], axis=0)
        np.testing.assert_allclose(g, want, **TOL)


def test_partial_tape_takes_one_layer_and_horovods_arguments():
    model = _model()
    x, y = _data(ME)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    # Horovod's positional order, scale_local_gradients last.
    tape = tfring.PartialDistributedGradientTape(
        tape, '', '', tfring.Compression.none, False, tfring.Average, 1.0,
        0, None, tfring.global_process_set, model.layers[1], False)
    assert tape.scale_local_gradients is False
    local_pairs, global_pairs = tape.get_local_and_global_gradients(
        loss, model.trainable_variables)
    assert [id(s) for s, _ in local_pairs] == [
        id(v) for v in model.layers[1].trainable_variables]
    assert len(global_pairs) == 4
    per_rank = [_model_grads(model, r) for r in range(N)]
    np.testing.assert_allclose(local_pairs[0][1], per_rank[ME][2], **TOL)
    np.testing.assert_allclose(global_pairs[0][1],
                               np.mean([p[0] for p in per_rank], axis=0),
                               **TOL)


# --- process sets ---------------------------------------------------------


@contextlib.contextmanager
def _initialized_with_sets():
    """tfring with the sets {0..h-1} and {h..n-1}; yields this rank's."""
    half = (N + 1) // 2
    sets = [tfring.ProcessSet(list(range(half))),
            tfring.ProcessSet(list(range(half, N)))]
    WORLD.Barrier()
    tfring.shutdown()
    try:
        tfring.init(process_sets=sets)
        yield sets[0] if ME < half else sets[1]
    finally:
        WORLD.Barrier()
        tfring.shutdown()
        tfring.init()  # as conftest left it


@pytest.mark.requires_ranks(2)
def test_local_gradient_is_divided_by_the_process_sets_size():
    with _initialized_with_sets() as mine:
        for mode in MODES:
            gw, gb = _tape_grads(mode, process_set=mine)
            np.testing.assert_allclose(gw, _own_grads(ME)[0] / mine.size(),
                                       **TOL)
            np.testing.assert_allclose(gb, _mean_grads(mine.ranks)[1], **TOL)
            opt = hvd_keras.DistributedOptimizer(
                keras.optimizers.SGD(1.0), process_set=mine)
            w, b = _variables()
            opt.register_local_var(w)
            opt.build([w, b])
            grads = [tf.constant(g) for g in _own_grads(ME)]
            _run(lambda: opt.apply(grads, [w, b]), mode)
            w0, b0 = [v.numpy() for v in _variables()]
            np.testing.assert_allclose(
                w, w0 - _own_grads(ME)[0] / mine.size(), **TOL)
            np.testing.assert_allclose(
                b, b0 - _mean_grads(mine.ranks)[1], **TOL)


# --- Keras DistributedOptimizer.register_local_var ------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", [True, False])
def test_optimizer_applies_the_local_gradient(mode, scale):
    w, b = _variables()
    w0, b0 = w.numpy(), b.numpy()
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.5),
                                         scale_local_gradients=scale)
    assert opt.scale_local_gradients is scale
    opt.register_local_var(w)
    opt.build([w, b])
    grads = [tf.constant(g) for g in _own_grads(ME)]
    _run(lambda: opt.apply_gradients(zip(grads, [w, b])), mode)
    divisor = N if scale else 1
    np.testing.assert_allclose(w, w0 - 0.5 * _own_grads(ME)[0] / divisor,
                               **TOL)
    np.testing.assert_allclose(b, b0 - 0.5 * _mean_grads(range(N))[1],
                               **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_backward_passes_sum_locally_then_scale(mode):
    # Horovod: the local sum over the passes, divided by size (and by the
    # passes with average_aggregated_gradients).
    w, b = _variables()
    w0, b0 = w.numpy(), b.numpy()
    opt = hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(1.0), backward_passes_per_step=2,
        average_aggregated_gradients=True)
    opt.register_local_var(w)
    opt.build([w, b])
    step = opt.apply if mode == "eager" else tf.function(opt.apply)
    first = [tf.constant(g) for g in _own_grads(ME)]
    second = [tf.constant(2.0 * g) for g in _own_grads(ME)]
    step(first, [w, b])
    np.testing.assert_allclose(w, w0)
    step(second, [w, b])
    np.testing.assert_allclose(w, w0 - 1.5 * _own_grads(ME)[0] / N, **TOL)
    np.testing.assert_allclose(b, b0 - 1.5 * _mean_grads(range(N))[1],
                               **TOL)


def _fit_model(local):
    model = _model()
    opt = keras.optimizers.SGD(0.1)
    if local == "register":
        opt = hvd_keras.DistributedOptimizer(opt)
        opt.register_local_var(model.layers[0].kernel)
    else:  # PartialDistributedOptimizer with the first layer local.
        opt = hvd_keras.PartialDistributedOptimizer(
            opt, local_layers=[model.layers[0]])
    model.compile(optimizer=opt, loss="mse")
    return model


@pytest.mark.parametrize("local", ["register", "partial"])
def test_fit_leaves_local_weights_per_rank_and_others_equal(local):
    model = _fit_model(local)
    local_ids = ({id(model.layers[0].kernel)} if local == "register" else
                 {id(v) for v in model.layers[0].trainable_variables})
    before = [v.numpy() for v in model.trainable_variables]
    per_rank = [_model_grads(model, r) for r in range(N)]
    x, y = _data(ME)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    # One step: exactly SGD with the rank's own gradient / size for the
    # local weights and with the average for the others.
    for i, v in enumerate(model.trainable_variables):
        if id(v) in local_ids:
            step = per_rank[ME][i] / N
        else:
            step = np.mean([p[i] for p in per_rank], axis=0)
        np.testing.assert_allclose(v, before[i] - 0.1 * step, **TOL)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    for v in model.trainable_variables:
        everyone = WORLD.allgather(v.numpy())
        if id(v) in local_ids:
            if N > 1:
                assert not np.allclose(everyone[0], everyone[1])
        else:
            for other in everyone[1:]:
                np.testing.assert_array_equal(other, everyone[0])


def test_partial_optimizer_before_the_model_is_built():
    # The local layers' variables are looked up at each step, so layers
    # without variables yet (no Input) still count once built.
    local = keras.layers.Dense(2, kernel_initializer="ones")
    shared = keras.layers.Dense(1, kernel_initializer="ones")
    model = keras.Sequential([local, shared])
    assert not local.built
    opt = hvd_keras.PartialDistributedOptimizer(
        keras.optimizers.SGD(0.1), local_layers=local)
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(ME)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    everyone = WORLD.allgather(local.kernel.numpy())
    if N > 1:
        assert not np.allclose(everyone[0], everyone[1])
    for v in shared.trainable_variables:
        everyone = WORLD.allgather(v.numpy())
        for other in everyone[1:]:
            np.testing.assert_array_equal(other, everyone[0])


def test_loss_scale_overflow_in_one_ranks_local_gradient_skips_everywhere():
    # Local gradients differ per rank; the ranks agree on an overflow, so
    # every rank skips the step and halves its loss scale together.
    w, b = _variables()
    w0, b0 = w.numpy(), b.numpy()
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), initial_scale=4.0))
    assert isinstance(opt, hvd_keras.DistributedLossScaleOptimizer)
    opt.register_local_var(w)
    grads = [tf.constant(g * 4.0) for g in _own_grads(ME)]
    bad = [tf.constant(np.full((3, 1), np.inf if ME == 0 else 1.0,
                               np.float32)), grads[1]]
    opt.apply(bad, [w, b])
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(b, b0)
    assert float(np.asarray(opt.dynamic_scale)) == 2.0
    scaled = [tf.constant(g * 2.0) for g in _own_grads(ME)]
    tf.function(opt.apply)(scaled, [w, b])
    np.testing.assert_allclose(w, w0 - 0.5 * _own_grads(ME)[0] / N, **TOL)
    np.testing.assert_allclose(b, b0 - 0.5 * _mean_grads(range(N))[1],
                               **TOL)


def test_config_keeps_scale_local_gradients():
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                         scale_local_gradients=False)
    config = opt.get_config()
    assert config["scale_local_gradients"] is False
    restored = hvd_keras.DistributedOptimizer.from_config(config)
    assert restored.scale_local_gradients is False
    # Files saved before the option existed default to Horovod's True.
    del config["scale_local_gradients"]
    assert hvd_keras.DistributedOptimizer.from_config(
        config).scale_local_gradients is True


# --- signatures -----------------------------------------------------------


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_signatures_are_horovods():
    # Positional calls written for Horovod 0.28.1 bind the same parameters.
    tape = ["gradtape", "device_dense", "device_sparse", "compression",
            "sparse_as_dense", "op", "gradient_predivide_factor",
            "num_groups", "groups", "process_set"]
    assert _params(tfring.DistributedGradientTape) == tape + [
        "scale_local_gradients"]
    assert _params(tfring.PartialDistributedGradientTape) == tape + [
        "local_layers", "scale_local_gradients"]
    keras_head = ["optimizer", "name", "device_dense", "device_sparse",
                  "compression", "sparse_as_dense",
                  "gradient_predivide_factor", "op",
                  "backward_passes_per_step", "average_aggregated_gradients"]
    assert _params(hvd_keras.DistributedOptimizer.__init__)[1:] == (
        keras_head + ["num_groups", "groups", "process_set",
                      "scale_local_gradients"])
    # horovod.keras.PartialDistributedOptimizer has no num_groups.
    assert _params(hvd_keras.PartialDistributedOptimizer) == keras_head + [
        "groups", "process_set", "local_layers", "scale_local_gradients"]
    for fn in (tfring.DistributedGradientTape,
               tfring.PartialDistributedGradientTape,
               hvd_keras.DistributedOptimizer.__init__,
               hvd_keras.PartialDistributedOptimizer):
        default = inspect.signature(fn).parameters["scale_local_gradients"]
        assert default.default is True, fn


# --- errors (raised before anything runs) --------------------------------


def test_register_local_source_refuses_a_layer_or_a_list():
    layer = keras.layers.Dense(1)
    tape = tfring.DistributedGradientTape(tf.GradientTape())
    with pytest.raises(TypeError) as info:
        tape.register_local_source(layer)
    message = str(info.value)
    assert "received the layer" in message
    assert "Expected one source" in message
    assert "local_layers=" in message
    w, _ = _variables()
    with pytest.raises(TypeError) as info:
        tape.register_local_source([w])
    message = str(info.value)
    assert "of type list" in message
    assert "call it once per variable" in message


def test_register_local_var_refuses_a_non_variable():
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(TypeError) as info:
        opt.register_local_var("kernel")
    message = str(info.value)
    assert "DistributedOptimizer.register_local_var()" in message
    assert "Expected one variable" in message


@pytest.mark.parametrize("local_layers", [
    "dense", 3, [keras.layers.Dense(1), "dense"]])
def test_local_layers_must_be_layers(local_layers):
    for make in (
            lambda: tfring.PartialDistributedGradientTape(
                tf.GradientTape(), local_layers=local_layers),
            lambda: hvd_keras.PartialDistributedOptimizer(
                keras.optimizers.SGD(0.1), local_layers=local_layers)):
        with pytest.raises(ValueError) as info:
            make()
        message = str(info.value)
        assert "Expected a keras.layers.Layer or a list of them" in message
        assert "local_layers=[model.layers[0]]" in message


def test_scale_local_gradients_must_be_a_bool():
    with pytest.raises(TypeError) as info:
        tfring.DistributedGradientTape(tf.GradientTape(),
                                       scale_local_gradients="yes")
    assert "scale_local_gradients='yes'" in str(info.value)
    with pytest.raises(TypeError) as info:
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                       scale_local_gradients=None)
    assert "Expected True" in str(info.value)


def test_registering_after_the_first_step_warns():
    w, b = _variables()
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1))
    grads = [tf.constant(g) for g in _own_grads(ME)]
    opt.apply(grads, [w, b])
    with pytest.warns(UserWarning, match="Register local variables before"):
        opt.register_local_var(w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvd_keras.DistributedOptimizer(
            keras.optimizers.SGD(0.1)).register_local_var(w)
