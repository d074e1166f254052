# tfring.SyncBatchNormalization at any number of ranks: every rank holds a
# different batch, of a different size (one rank has 1 row, in one test 0),
# and the layer's training output, its updated moving mean and variance, its
# gradients and a model.fit run must equal plain keras BatchNormalization
# applied, in this one process, to the concatenation of every rank's batch.
# Also: inference (moving statistics, no collective), mixed precision,
# masks, batch renormalization, save/load, process sets, errors.
#
# Why: a synchronized batch norm that averaged the ranks' means (Horovod's
# formula) or skipped the allreduce would still produce plausible numbers;
# only a comparison with the global batch, with uneven batch sizes and
# per-rank data whose means differ, tells them apart. Every rank builds all
# ranks' data from seeds, so the reference needs no communication.

import numpy as np
import pytest
import tensorflow as tf
import keras
from mpi4py import MPI

import tfring
import tfring.keras as hvd_keras
from tfring import sync_batch_norm

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()
MODES = ["eager", "function"]
# Rank r's batch size (a rank with a single row from 2 ranks on).
BATCH_SIZES = (5, 1, 8, 3)


def batch_size(r):
    return BATCH_SIZES[r % len(BATCH_SIZES)]


def rank_batch(r, shape, step=0, dtype=np.float32, rows=None):
    """Rank r's batch of `step`: shape (rows, *shape), with a mean and a
    spread that depend on r, so that local and global statistics differ."""
    rng = np.random.default_rng(1000 * step + r)
    rows = batch_size(r) if rows is None else rows
    x = rng.normal(size=(rows,) + tuple(shape)) * (1.0 + r) + 2.0 * r
    return x.astype(dtype)


def my_rows(ranks, sizes=None):
    """The slice of the concatenated batch of `ranks` that is this rank's."""
    sizes = sizes or {r: batch_size(r) for r in ranks}
    start = sum(sizes[r] for r in ranks if r < ME)
    return slice(start, start + sizes[ME])


def bn_kwargs(**extra):
    # Values that make every part of the computation visible: a momentum
    # far from 1, gamma and beta other than 1 and 0.
    return dict(momentum=0.5, epsilon=1e-3,
                gamma_initializer=keras.initializers.Constant(1.5),
                beta_initializer=keras.initializers.Constant(-0.25),
                **extra)


def _call(layer, mode, x, **kwargs):
    if mode == "eager":
        return layer(x, training=True, **kwargs)
    return tf.function(lambda x: layer(x, training=True, **kwargs))(x)


def assert_close(actual, expected, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(actual, np.float64),
                               np.asarray(expected, np.float64),
                               rtol=rtol, atol=atol)


# --- what it is -------------------------------------------------------------


def test_is_where_horovod_puts_it():
    assert tfring.SyncBatchNormalization is (
        sync_batch_norm.SyncBatchNormalization)
    layer = tfring.SyncBatchNormalization(fused=False)
    assert isinstance(layer, keras.layers.BatchNormalization)
    assert layer.name.startswith("sync_batch_normalization")
    assert layer.process_set is tfring.global_process_set
    assert keras.saving.get_registered_name(type(layer)) == (
        "tfring>SyncBatchNormalization")
    # Keras' positional axis still works.
    assert tfring.SyncBatchNormalization(1).axis == 1


# --- training mode: the statistics of the global batch ----------------------

CASES = {
    # name: (per-row shape, layer kwargs)
    "features": ((4,), dict(axis=-1)),
    "images_channels_last": ((3, 2, 4), dict(axis=-1)),
    "images_channels_first": ((4, 3, 2), dict(axis=1)),
    "renorm": ((4,), dict(axis=-1, renorm=True, renorm_momentum=0.5)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", MODES)
def test_training_matches_the_global_batch(mode, case):
    shape, kwargs = CASES[case]
    layer = tfring.SyncBatchNormalization(**bn_kwargs(**kwargs))
    reference = keras.layers.BatchNormalization(**bn_kwargs(**kwargs))
    for step in range(2):
        batches = [rank_batch(r, shape, step) for r in range(N)]
        out = _call(layer, mode, batches[ME])
        expected = reference(np.concatenate(batches), training=True)
        assert out.shape == batches[ME].shape
        assert_close(out, np.asarray(expected)[my_rows(range(N))])
        for name in ["moving_mean", "moving_variance"]:
            assert_close(getattr(layer, name).numpy(),
                         getattr(reference, name).numpy())
    if case == "features":
        # The reference is what the formulas say (biased variance), and at
        # 2+ ranks it is not what this rank's batch alone would give.
        last = np.concatenate([rank_batch(r, shape, 1) for r in range(N)])
        first = np.concatenate([rank_batch(r, shape, 0) for r in range(N)])
        want_mean = 0.5 * (0.5 * first.mean(0)) + 0.5 * last.mean(0)
        want_var = 0.5 * (0.5 + 0.5 * first.var(0)) + 0.5 * last.var(0)
        assert_close(layer.moving_mean.numpy(), want_mean)
        assert_close(layer.moving_variance.numpy(), want_var)
        if N > 1:
            local = rank_batch(ME, shape, 1)
            assert not np.allclose(last.mean(0), local.mean(0), atol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_ranks_with_empty_batches(mode):
    # Rank 1 (from 2 ranks on) has no rows; the others normalize with the
    # statistics of theirs. Inside tf.function with an unknown batch size.
    sizes = {r: 0 if r == 1 else batch_size(r) for r in range(N)}
    layer = tfring.SyncBatchNormalization(**bn_kwargs())
    reference = keras.layers.BatchNormalization(**bn_kwargs())
    batches = [rank_batch(r, (4,), rows=sizes[r]) for r in range(N)]
    if mode == "eager":
        out = layer(batches[ME], training=True)
    else:
        fn = tf.function(lambda x: layer(x, training=True),
                         input_signature=[tf.TensorSpec([None, 4])])
        out = fn(batches[ME])
    expected = reference(np.concatenate(batches), training=True)
    assert out.shape == (sizes[ME], 4)
    assert_close(out, np.asarray(expected)[my_rows(range(N), sizes)])
    assert_close(layer.moving_mean.numpy(), reference.moving_mean.numpy())
    assert_close(layer.moving_variance.numpy(),
                 reference.moving_variance.numpy())


@pytest.mark.parametrize("mode", MODES)
def test_mask_weights_elements_across_ranks(mode):
    # Keras' masking: masked positions count nowhere, on any rank.
    shape = (6, 3)  # (time, features)
    layer = tfring.SyncBatchNormalization(**bn_kwargs())
    reference = keras.layers.BatchNormalization(**bn_kwargs())
    batches = [rank_batch(r, shape) for r in range(N)]
    masks = [np.random.default_rng(50 + r).random(
        (batch_size(r), shape[0])) < 0.3 * (r + 1) for r in range(N)]
    out = _call(layer, mode, batches[ME], mask=masks[ME])
    expected = reference(np.concatenate(batches), training=True,
                         mask=np.concatenate(masks))
    assert_close(out, np.asarray(expected)[my_rows(range(N))], rtol=1e-4,
                 atol=1e-4)
    assert_close(layer.moving_mean.numpy(), reference.moving_mean.numpy())
    assert_close(layer.moving_variance.numpy(),
                 reference.moving_variance.numpy())


def test_horovods_test_case():
    # horovod/test/parallel/test_tensorflow.py, test_horovod_syncbn_cpu: the
    # global batch holds one row per rank; axis=1.
    for columns in ([0, 1], [1]):
        x = np.stack([np.array([[r, r + 1], [r * 2, r * 2 + 1],
                                [r * 3, r * 3 + 1], [r * 4, r * 4 + 1]],
                               np.float32)[:, columns]
                      for r in range(N)])
        bn = keras.layers.BatchNormalization(axis=1)
        sync_bn = tfring.SyncBatchNormalization(axis=1)
        expected = bn(x, training=True)
        out = sync_bn(x[ME:ME + 1], training=True)
        assert_close(out, np.asarray(expected)[ME:ME + 1])
        assert_close(sync_bn.moving_mean.numpy(), bn.moving_mean.numpy())
        assert_close(sync_bn.moving_variance.numpy(),
                     bn.moving_variance.numpy())


# --- inference -----------------------------------------------------------


def test_inference_uses_the_moving_statistics_and_no_collective():
    layer = tfring.SyncBatchNormalization(**bn_kwargs())
    for step in range(2):
        layer(rank_batch(ME, (4,), step), training=True)
    mean = layer.moving_mean.numpy()
    variance = layer.moving_variance.numpy()
    x = rank_batch(ME, (4,), step=7)
    want = (x - mean) / np.sqrt(variance + 1e-3) * 1.5 - 0.25
    # Each rank a different number of calls: a collective would hang.
    for _ in range(ME + 1):
        assert_close(layer(x, training=False), want)
        assert_close(layer(x), want)
        assert_close(tf.function(lambda x: layer(x, training=False))(x),
                     want)
    # A frozen layer runs in inference mode even with training=True.
    layer.trainable = False
    for _ in range(ME + 1):
        assert_close(layer(x, training=True), want)
    assert_close(layer.moving_mean.numpy(), mean)
    plain = keras.layers.BatchNormalization(**bn_kwargs())
    plain.build(x.shape)
    plain.set_weights(layer.get_weights())
    assert_close(plain(x, training=False), want)


# --- dtypes -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_mixed_float16_statistics_in_float32(mode):
    # Values whose squares overflow float16 (65504): statistics computed in
    # float16 would be inf.
    policy = "mixed_float16"
    layer = tfring.SyncBatchNormalization(**bn_kwargs(dtype=policy))
    reference = keras.layers.BatchNormalization(**bn_kwargs(dtype=policy))
    batches = [(rank_batch(r, (3,)) * 10 + 300).astype(np.float16)
               for r in range(N)]
    out = _call(layer, mode, batches[ME])
    expected = reference(np.concatenate(batches), training=True)
    assert out.dtype == tf.float16 and expected.dtype == tf.float16
    assert layer.moving_mean.dtype == "float32"
    assert_close(out, np.asarray(expected)[my_rows(range(N))], rtol=0,
                 atol=1e-2)
    assert np.all(np.isfinite(layer.moving_variance.numpy()))
    assert_close(layer.moving_mean.numpy(), reference.moving_mean.numpy())
    assert_close(layer.moving_variance.numpy(),
                 reference.moving_variance.numpy(), rtol=1e-4)


def test_float64():
    layer = tfring.SyncBatchNormalization(**bn_kwargs(dtype="float64"))
    reference = keras.layers.BatchNormalization(**bn_kwargs(dtype="float64"))
    batches = [rank_batch(r, (3,), dtype=np.float64) for r in range(N)]
    out = layer(batches[ME], training=True)
    expected = reference(np.concatenate(batches), training=True)
    assert out.dtype == tf.float64
    assert_close(out, np.asarray(expected)[my_rows(range(N))], rtol=1e-10,
                 atol=1e-10)


# --- gradients ----------------------------------------------------------------


def _dense_then_bn(sync):
    dense = keras.layers.Dense(
        3, kernel_initializer=keras.initializers.RandomNormal(seed=5),
        bias_initializer=keras.initializers.Constant(0.1))
    bn_class = (tfring.SyncBatchNormalization if sync
                else keras.layers.BatchNormalization)
    return dense, bn_class(**bn_kwargs())


@pytest.mark.parametrize("mode", MODES)
def test_gradients_are_those_of_the_global_loss(mode):
    # Rank r's loss is sum(y_r * w_r). The gradient on rank r of its own
    # input is the slice of d(sum of every rank's loss)/dx (the statistics
    # carry the other ranks' losses back through the allreduce), and the
    # rank's parameter gradients sum over ranks to the gradient of that
    # total loss: what DistributedGradientTape(op=Sum) would apply.
    batches = [rank_batch(r, (4,)) for r in range(N)]
    loss_weights = [np.random.default_rng(70 + r).normal(
        size=(batch_size(r), 3)).astype(np.float32) for r in range(N)]
    dense, bn = _dense_then_bn(sync=True)

    def grads(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(bn(dense(x), training=True) * w)
        variables = [dense.kernel, dense.bias, bn.gamma, bn.beta]
        return tape.gradient(loss, [x] + variables)

    fn = grads if mode == "eager" else tf.function(grads)
    got = fn(tf.constant(batches[ME]), tf.constant(loss_weights[ME]))

    ref_dense, ref_bn = _dense_then_bn(sync=False)
    x_all = tf.constant(np.concatenate(batches))
    with tf.GradientTape() as tape:
        tape.watch(x_all)
        total = tf.reduce_sum(ref_bn(ref_dense(x_all), training=True)
                              * np.concatenate(loss_weights))
    want = tape.gradient(total, [x_all, ref_dense.kernel, ref_dense.bias,
                                 ref_bn.gamma, ref_bn.beta])
    assert all(g is not None for g in got)
    assert_close(got[0], np.asarray(want[0])[my_rows(range(N))], rtol=1e-4,
                 atol=1e-4)
    for g, w in zip(got[1:], want[1:]):
        assert_close(tfring.allreduce(g, op=tfring.Sum), w, rtol=1e-4,
                     atol=1e-4)
    if N > 1:  # the other ranks' part matters: a local BN differs
        local_dense, local_bn = _dense_then_bn(sync=False)
        x = tf.constant(batches[ME])
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(local_bn(local_dense(x), training=True)
                                 * loss_weights[ME])
        assert not np.allclose(tape.gradient(loss, x), got[0], atol=1e-3)


# --- model.fit ----------------------------------------------------------------


def _model(sync):
    keras.utils.set_random_seed(11)  # the same weights on every rank
    bn_class = (tfring.SyncBatchNormalization if sync
                else keras.layers.BatchNormalization)
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(3),
        bn_class(**bn_kwargs()),
        keras.layers.Dense(1),
    ])


@pytest.mark.parametrize("jit_compile", [False, "auto"])
def test_model_fit_matches_one_process_on_the_global_batch(jit_compile):
    # Each rank fits its own data, 3 steps of its own batch size; the
    # DistributedOptimizer averages the ranks' gradients. One process
    # training on the concatenated batches with the loss
    # mean over ranks of (mean over the rank's rows) must end identical.
    steps, lr = 3, 0.1
    data = [(rank_batch(r, (4,), rows=steps * batch_size(r)),
             rank_batch(r, (1,), step=9, rows=steps * batch_size(r)))
            for r in range(N)]
    model = _model(sync=True)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(lr)), loss="mse", jit_compile=jit_compile)
    reference = _model(sync=False)
    reference.set_weights(model.get_weights())
    history = model.fit(*data[ME], batch_size=batch_size(ME), epochs=1,
                        shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"][0])

    for s in range(steps):
        pieces = [(x[s * batch_size(r):(s + 1) * batch_size(r)],
                   y[s * batch_size(r):(s + 1) * batch_size(r)])
                  for r, (x, y) in enumerate(data)]
        x_all = np.concatenate([p[0] for p in pieces])
        with tf.GradientTape() as tape:
            out = reference(x_all, training=True)
            losses, start = [], 0
            for r, (_, y) in enumerate(pieces):
                rows = out[start:start + batch_size(r)]
                losses.append(tf.reduce_mean(tf.square(rows - y)))
                start += batch_size(r)
            loss = tf.add_n(losses) / N
        variables = reference.trainable_variables
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(lr * g)
    for got, want in zip(model.weights, reference.weights):
        assert got.path.split("/")[-1] == want.path.split("/")[-1]
        assert_close(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


# --- saving -------------------------------------------------------------------


def test_save_and_load(tmp_path):
    model = _model(sync=True)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(0.1)), loss="mse")
    x = rank_batch(ME, (4,), rows=2 * batch_size(ME))
    model.fit(x, x[:, :1], batch_size=batch_size(ME), verbose=0)
    path = str(tmp_path / f"sync_bn_rank{ME}.keras")
    model.save(path)
    loaded = keras.models.load_model(path)  # no custom_objects needed
    layer = loaded.layers[1]
    assert type(layer) is tfring.SyncBatchNormalization
    assert layer.get_config() == model.layers[1].get_config()
    for got, want in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert_close(loaded(x, training=False), model(x, training=False))
    # The loaded layer still synchronizes.
    reference = keras.layers.BatchNormalization.from_config(
        model.layers[1].get_config())
    reference.build((None, 3))
    reference.set_weights(layer.get_weights())
    hidden = [np.asarray(loaded.layers[0](rank_batch(r, (4,), step=3)))
              for r in range(N)]
    out = layer(hidden[ME], training=True)
    expected = reference(np.concatenate(hidden), training=True)
    assert_close(out, np.asarray(expected)[my_rows(range(N))])
    assert_close(layer.moving_mean.numpy(), reference.moving_mean.numpy())


# --- process sets -------------------------------------------------------------


def _shutdown_together():
    WORLD.Barrier()  # every rank done with its sets' collectives
    tfring.shutdown()


@pytest.fixture
def halves():
    """(lower, upper): the first ceil(N/2) ranks and the others, registered
    (None at one rank, where a set of every rank cannot be); tfring as
    conftest left it afterwards."""
    if N == 1:
        yield None
        return
    lower = tfring.ProcessSet(list(range((N + 1) // 2)))
    upper = tfring.ProcessSet(list(range((N + 1) // 2, N)))
    _shutdown_together()
    tfring.init(process_sets=[lower, upper])
    try:
        yield lower, upper
    finally:
        _shutdown_together()
        tfring.init()


@pytest.mark.parametrize("mode", MODES)
def test_statistics_of_the_process_set_only(mode, halves):
    if halves is None:
        mine, other = tfring.global_process_set, None
    else:
        mine, other = halves if ME in halves[0].ranks else halves[::-1]
    layer = tfring.SyncBatchNormalization(process_set=mine, **bn_kwargs())
    reference = keras.layers.BatchNormalization(**bn_kwargs())
    batches = {r: rank_batch(r, (4,)) for r in mine.ranks}
    out = _call(layer, mode, batches[ME])
    expected = reference(np.concatenate([batches[r] for r in mine.ranks]),
                         training=True)
    assert_close(out, np.asarray(expected)[my_rows(mine.ranks)])
    assert_close(layer.moving_mean.numpy(), reference.moving_mean.numpy())
    assert_close(layer.moving_variance.numpy(),
                 reference.moving_variance.numpy())
    if other is None:
        return
    # A set without this rank: refused in training mode, before any
    # communication; inference needs no set.
    foreign = tfring.SyncBatchNormalization(process_set=other)
    x = rank_batch(ME, (4,))
    # Built first: a Keras layer whose first call fails while a tf.function
    # traces it keeps unusable weights (any Keras layer, not this one).
    foreign.build(x.shape)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"tfring.SyncBatchNormalization was called on "
                             rf"rank {ME} with process_set=ProcessSet\("
                             rf".*which does not contain rank {ME}"):
        _call(foreign, mode, x)
    assert_close(foreign(x, training=False), x / np.sqrt(1 + 1e-3))


def test_errors():
    with pytest.raises(ValueError,
                       match=r"tfring.SyncBatchNormalization received "
                             r"fused=True. Expected fused=False"):
        tfring.SyncBatchNormalization(fused=True)
    with pytest.raises(ValueError, match=r"received fused=None"):
        tfring.SyncBatchNormalization(fused=None)
    with pytest.raises(TypeError,
                       match=r"tfring.SyncBatchNormalization received "
                             r"process_set=\[0\] of type list. Expected a "
                             r"tfring.ProcessSet"):
        tfring.SyncBatchNormalization(process_set=[0])
    unregistered = tfring.SyncBatchNormalization(
        process_set=tfring.ProcessSet([0]))
    with pytest.raises(ValueError,
                       match=r"tfring.SyncBatchNormalization received "
                             r"ProcessSet\(process_set_id=None, ranks=\[0\]\)"
                             r", which is not registered"):
        unregistered(np.ones((2, 3), np.float32), training=True)


def test_refuses_a_keras_without_the_hook(monkeypatch):
    monkeypatch.setattr(sync_batch_norm, "_HOOK_PROBLEM",
                        "keras.layers.BatchNormalization has no _moments "
                        "method")
    with pytest.raises(RuntimeError,
                       match=r"needs the Keras 3 BatchNormalization._moments"
                             r"\(inputs, mask\) hook, but keras.layers."
                             r"BatchNormalization has no _moments method"):
        tfring.SyncBatchNormalization()
    assert sync_batch_norm._hook_problem() is None  # this Keras has it
