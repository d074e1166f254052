# Wire compression (Compression.bf16_wire / fp16_wire) at any number of ranks
# on one host: the core encodes only what crosses hosts, so here every result
# must equal the uncompressed one bit for bit, through allreduce,
# grouped_allreduce, DistributedGradientTape and the Keras
# DistributedOptimizer; tensors the compression does not apply to (float64,
# int32, Max) are untouched; Compression.fp16 keeps Horovod's meaning (a
# cast). The encodings themselves, and sums across hosts, are tested in
# tests/test_wire_compression_core.py and tests/test_multihost.py.

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfring
import tfring.keras as hvd_keras

WIRE = [tfring.Compression.bf16_wire, tfring.Compression.fp16_wire]
MODES = ["eager", "function"]


def _run(fn, mode):
    return fn() if mode == "eager" else tf.function(fn)()


def _values(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed + 31 * tfring.rank())
    # Magnitudes that bfloat16 and float16 could not carry exactly.
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)).astype(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compression", WIRE, ids=lambda c: c.wire)
@pytest.mark.parametrize("op", [tfring.Sum, tfring.Average])
def test_allreduce_equals_uncompressed_on_one_host(compression, op, mode):
    for shape in [(), (7,), (300, 5), (70000,)]:
        x = tf.constant(_values(shape))
        plain = _run(lambda: tfring.allreduce(x, op=op, name=f"plain.{shape}"), mode)
        wired = _run(lambda: tfring.allreduce(x, op=op, compression=compression,
                                              name=f"wire.{shape}"), mode)
        np.testing.assert_array_equal(wired.numpy(), plain.numpy())


@pytest.mark.parametrize("compression", WIRE, ids=lambda c: c.wire)
def test_grouped_allreduce_and_other_dtypes_are_untouched(compression):
    tensors = [tf.constant(_values((5, 3), seed=1)),
               tf.constant(_values((4,), np.float64, seed=2)),
               tf.constant(np.arange(6, dtype=np.int32) * (tfring.rank() + 1))]
    plain = tfring.grouped_allreduce(tensors, op=tfring.Sum)
    wired = tfring.grouped_allreduce(tensors, op=tfring.Sum, compression=compression)
    for p, w in zip(plain, wired):
        assert p.dtype == w.dtype
        np.testing.assert_array_equal(w.numpy(), p.numpy())
    x = tf.constant(_values((9,), seed=3))
    np.testing.assert_array_equal(
        tfring.allreduce(x, op=tfring.Max, compression=compression).numpy(),
        tfring.allreduce(x, op=tfring.Max).numpy())


@pytest.mark.parametrize("compression", WIRE, ids=lambda c: c.wire)
def test_gradient_tape_with_wire_compression(compression):
    w = tf.Variable(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3))
    x = tf.constant(_values((8, 4), seed=4))

    def gradient(compression):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(x @ w))
        tape = tfring.DistributedGradientTape(tape, compression=compression)
        return tape.gradient(loss, [w])[0]

    np.testing.assert_array_equal(gradient(compression).numpy(),
                                  gradient(tfring.Compression.none).numpy())


@pytest.mark.parametrize("compression", WIRE, ids=lambda c: c.wire)
def test_keras_optimizer_with_wire_compression(compression):
    def train(compression):
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                             compression=compression)
        model.compile(optimizer=opt, loss="mse")
        rng = np.random.default_rng(6 + tfring.rank())
        x = rng.standard_normal((16, 4)).astype(np.float32)
        y = rng.standard_normal((16, 3)).astype(np.float32)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        return model, opt

    model, opt = train(compression)
    plain, _ = train(tfring.Compression.none)
    for a, b in zip(model.get_weights(), plain.get_weights()):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)
    # The choice survives the optimizer's config (model.save / load_model).
    config = opt.get_config()
    assert config["compression"] == f"{compression.wire}_wire"
    restored = hvd_keras.DistributedOptimizer.from_config(config)
    assert restored.compression is compression


def test_fp16_keeps_horovods_meaning():
    # A cast to float16 around the reduction: the result is float16-rounded.
    x = tf.constant(np.full((3,), 1.0 + 2.0 ** -12, np.float32))
    out = tfring.allreduce(x, op=tfring.Average, compression=tfring.Compression.fp16)
    assert out.dtype == tf.float32
    np.testing.assert_array_equal(out.numpy(), np.ones(3, np.float32))
