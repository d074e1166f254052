# tfring collectives inside XLA-compiled functions, at any number of ranks:
# tf.function(jit_compile=True) and Keras models compiled with
# jit_compile=True.
#
# Allreduce and broadcast are lowered to XLA custom calls
# (tfring/ops/kernels/xla_kernels.cc) that hand XLA's buffers to the core
# (xla_custom_calls.cc); allgather cannot be compiled (its output shape is
# only known at run time) and is rejected while tracing with a message that
# names jit_compile=False.
#
# Inputs are small integers derived from the rank, so expected values are
# exact in every dtype and compared exactly.

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfring

REDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16,
                 tf.bfloat16, tf.float32, tf.float64]
BROADCAST_DTYPES = REDUCE_DTYPES + [tf.uint16, tf.int16, tf.bool]
REDUCE_OPS = {"Sum": tfring.Sum, "Average": tfring.Average,
              "Min": tfring.Min, "Max": tfring.Max,
              "Product": tfring.Product}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _rank_values(rank, size, count=6):
    """Rank `rank`'s input: element i is i % 3 + (i + rank) % size."""
    i = np.arange(count)
    return (i % 3 + (i + rank) % size).astype(np.float64)


def _expected(op, dtype, size, count=6):
    stack = np.stack([_rank_values(r, size, count) for r in range(size)])
    if op == "Product":
        stack = 1.0 + (stack > 1.0)  # keep products of up to 3 ranks small
    if op == "Average":
        # The core multiplies the sum by 1/size in double precision and
        # truncates integers toward zero. The sum of element i is
        # size * (i % 3) + size * (size - 1) / 2: the mean is a multiple of
        # 0.5, exact in every floating type.
        mean = np.sum(stack, axis=0) * (1.0 / size)
        return np.trunc(mean) if dtype.is_integer else mean
    return {"Sum": np.sum, "Min": np.min, "Max": np.max,
            "Product": np.prod}[op](stack, axis=0)


def _input(op, rank, size, dtype, count=6):
    values = _rank_values(rank, size, count)
    if op == "Product":
        values = 1.0 + (values > 1.0)
    return tf.constant(values.astype(dtype.as_numpy_dtype))


def _compiled_hlo(function, *args):
    return function.experimental_get_compiler_ir(*args)(stage="hlo")


# ---------------------------------------------------------------------------
# tf.function(jit_compile=True)
# ---------------------------------------------------------------------------

def test_allreduce_every_op_and_dtype(rank, size):
    cases = [(op, dtype) for op in REDUCE_OPS for dtype in REDUCE_DTYPES]

    @tf.function(jit_compile=True)
    def reduce_all(inputs):
        return [tfring.allreduce(x, op=REDUCE_OPS[op])
                for (op, _), x in zip(cases, inputs)]

    inputs = [_input(op, rank, size, dtype) for op, dtype in cases]
    results = reduce_all(inputs)
    for (op, dtype), result in zip(cases, results):
        assert result.dtype == dtype
        np.testing.assert_array_equal(
            tf.cast(result, tf.float64).numpy(), _expected(op, dtype, size),
            err_msg=f"{op} {dtype.name}")


def test_allreduce_scale_factors_and_shapes(rank, size):
    @tf.function(jit_compile=True)
    def scaled(a, b, c):
        return (
            tfring.allreduce(a, op=tfring.Sum, prescale_factor=0.5,
                             postscale_factor=4.0),
            tfring.allreduce(b, op=tfring.Average, postscale_factor=2.0),
            tfring.allreduce(c, op=tfring.Average, prescale_factor=3.0),
            tfring.allreduce(a * 2.0),  # default op: Average
        )

    a = tf.fill([3, 4], float(rank + 1))
    b = tf.reshape(tf.range(24, dtype=tf.float64), [2, 3, 4]) + rank
    c = tf.constant(float(rank), dtype=tf.float32)  # a scalar
    sa, sb, sc, avg = scaled(a, b, c)
    total = size * (size + 1) / 2  # sum over ranks of rank + 1
    np.testing.assert_allclose(sa.numpy(), np.full([3, 4], 2.0 * total))
    mean_rank = (size - 1) / 2.0
    np.testing.assert_allclose(
        sb.numpy(), 2.0 * (np.arange(24).reshape(2, 3, 4) + mean_rank))
    np.testing.assert_allclose(sc.numpy(), 3.0 * mean_rank, rtol=1e-6)
    np.testing.assert_allclose(avg.numpy(), np.full([3, 4], total / size * 2),
                               rtol=1e-6)


def test_grouped_allreduce(rank, size):
    @tf.function(jit_compile=True)
    def grouped(tensors):
        return tfring.grouped_allreduce(tensors, op=tfring.Sum,
                                        postscale_factor=0.5)

    shapes = [[5], [2, 3], [], [4, 1, 2], [7]]
    tensors = [tf.fill(shape, float(rank + i)) for i, shape in
               enumerate(shapes)]
    results = grouped(tensors)
    assert len(results) == len(shapes)
    for i, (shape, result) in enumerate(zip(shapes, results)):
        expected = 0.5 * sum(r + i for r in range(size))
        np.testing.assert_allclose(result.numpy(), np.full(shape, expected))


def test_broadcast_every_root_and_dtype(rank, size):
    @tf.function(jit_compile=True)
    def broadcast_all(inputs):
        return [tfring.broadcast(x, root_rank=root)
                for root in range(size) for x in inputs]

    inputs = [tf.cast(tf.constant([rank % 2, 1, rank + 2]), dtype)
              for dtype in BROADCAST_DTYPES]
    results = broadcast_all(inputs)
    i = 0
    for root in range(size):
        for dtype in BROADCAST_DTYPES:
            expected = tf.cast(tf.constant([root % 2, 1, root + 2]), dtype)
            assert results[i].dtype == dtype
            np.testing.assert_array_equal(results[i].numpy(), expected.numpy(),
                                          err_msg=f"root {root} {dtype.name}")
            i += 1


def test_collectives_are_xla_custom_calls(rank, size):
    @tf.function(jit_compile=True)
    def step(x):
        return (tfring.allreduce(x, op=tfring.Sum, prescale_factor=0.25),
                tfring.broadcast(x, root_rank=0))

    x = tf.ones([4])
    hlo = _compiled_hlo(step, x)
    assert 'custom_call_target="tfring_allreduce"' in hlo
    assert 'custom_call_target="tfring_broadcast"' in hlo
    # The cross-rank name is the function and the position in it, and
    # the scale factor travels bit-exactly.
    assert 'tensor_name = "step/allreduce.0"' in hlo
    assert "prescale_factor = 0x3E800000 : f32" in hlo
    summed, broadcast = step(x)
    np.testing.assert_allclose(summed.numpy(), np.full([4], 0.25 * size))
    np.testing.assert_allclose(broadcast.numpy(), np.ones([4]))


def test_repeated_calls_and_control_flow(rank, size):
    @tf.function(jit_compile=True)
    def loop(x):
        def body(i, acc):
            return i + 1, tfring.allreduce(acc, op=tfring.Sum) / size + 1.0
        _, acc = tf.while_loop(lambda i, _: i < 3, body, [0, x])
        return tf.cond(tf.reduce_sum(acc) > 0,
                       lambda: tfring.allreduce(acc, op=tfring.Max),
                       lambda: acc)

    for step in range(3):
        x = tf.fill([3], float(rank + step))
        mean = (size - 1) / 2.0 + step
        np.testing.assert_allclose(loop(x).numpy(), np.full([3], mean + 3.0))


def test_gradient_through_compiled_allreduce(rank, size):
    x = tf.Variable(tf.fill([3], float(rank + 1)))

    @tf.function(jit_compile=True)
    def grad():
        with tf.GradientTape() as tape:
            y = tfring.allreduce(x * x, op=tfring.Sum)
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, x)

    # d/dx of sum over ranks of x_r^2: the gradient allreduce sums the
    # upstream ones (size) and the local derivative is 2 x.
    np.testing.assert_allclose(grad().numpy(), np.full([3], 2.0 * (rank + 1) * size))


def test_allgather_is_rejected_while_tracing(rank, size):
    @tf.function(jit_compile=True)
    def gather(x):
        return tfring.allgather(x)

    with pytest.raises(ValueError, match=r"jit_compile=False") as info:
        gather(tf.ones([2]))
    assert "allgather" in str(info.value)

    # The same function without XLA works.
    @tf.function(jit_compile=False)
    def gather_plain(x):
        return tfring.allgather(x)

    assert gather_plain(tf.ones([2])).shape == (2 * size,)


def test_alltoall_is_rejected_while_tracing(rank, size):
    @tf.function(jit_compile=True)
    def exchange(x):
        return tfring.alltoall(x)

    with pytest.raises(ValueError, match=r"jit_compile=False") as info:
        exchange(tf.ones([size]))
    assert "alltoall" in str(info.value)


@pytest.mark.parametrize("rows", [1, 4, 7])
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_compiles_with_static_shapes(op, rows, rank, size):
    # Rank r holds (r + 1) * (row index + 1); this rank keeps its block of
    # the (scaled) sum, the first rows % size ranks one row more.
    @tf.function(jit_compile=True)
    def scatter(x):
        return tfring.reducescatter(x, op=getattr(tfring, op),
                                    prescale_factor=2.0,
                                    postscale_factor=0.25)

    values = np.repeat(np.arange(1, rows + 1, dtype=np.float32)[:, None], 3,
                       axis=1)
    result = scatter(tf.constant(values * (rank + 1)))
    counts = [rows // size + (r < rows % size) for r in range(size)]
    begin = sum(counts[:rank])
    total = values * size * (size + 1) / 2 * 2.0 * 0.25
    if op == "Average":
        total = total / size
    np.testing.assert_allclose(result.numpy(), total[begin:begin + counts[rank]],
                               rtol=1e-6, err_msg=f"{op} rows={rows}")
    hlo = _compiled_hlo(scatter, tf.constant(values))
    assert 'custom_call_target="tfring_reducescatter"' in hlo


def test_sparse_allreduce_is_rejected_while_tracing(rank, size):
    @tf.function(jit_compile=True)
    def reduce_slices(values):
        slices = tf.IndexedSlices(values, tf.constant([0, 2]),
                                  dense_shape=tf.constant([4, 3]))
        return tf.convert_to_tensor(tfring.allreduce(slices))

    with pytest.raises(ValueError, match=r"sparse_as_dense=True"):
        reduce_slices(tf.ones([2, 3]))


@pytest.mark.requires_ranks(2)
def test_mismatched_shapes_fail_and_later_collectives_work(rank, size):
    @tf.function(jit_compile=True)
    def reduce(x):
        return tfring.allreduce(x, op=tfring.Sum)

    with pytest.raises(tf.errors.FailedPreconditionError, match=r"shape"):
        reduce(tf.ones([2 if rank == 0 else 3])).numpy()
    np.testing.assert_allclose(reduce(tf.ones([2])).numpy(), np.full([2], size))


@pytest.mark.requires_ranks(2)
def test_a_compiled_allreduce_carries_its_wire_compression(rank, size):
    # Rank 0 asks for bf16 on the wire, the others for none: the core sees
    # the difference, so the compiled call passed its compression along.
    def compiled(compression):
        return tf.function(lambda x: tfring.allreduce(
            x, op=tfring.Sum, compression=compression, name="xla_wire"),
            jit_compile=True)

    mixed = tfring.Compression.bf16_wire if rank == 0 else tfring.Compression.none
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"xla_wire.*wire compression.*bf16.*none"):
        compiled(mixed)(tf.ones([4])).numpy()
    # On one host the wire compression changes nothing.
    x = tf.constant([1.0 + 2.0 ** -12, 3.0, -5.5, 7.25]) * (rank + 1)
    np.testing.assert_array_equal(
        compiled(tfring.Compression.bf16_wire)(x).numpy(),
        tfring.allreduce(x, op=tfring.Sum, name="xla_wire_plain").numpy())


def _jit_devices(op):
    from tensorflow.python.framework import kernels
    return {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel
            if k.device_type.endswith("_JIT")}


def test_unknown_reduce_op_is_refused_when_compiled(rank, size):
    # The raw op with a reduce_op that is not one of tfring's: refused when
    # XLA compiles it, as the TensorFlow kernel refuses it, rather than
    # reduced as a Sum.
    from tfring.ops.collective_ops import _ops_library

    @tf.function(jit_compile=True)
    def step(x):
        return _ops_library.tfring_allreduce(
            x, tensor_name="unknown_op", reduce_op=7, prescale_factor=1.0,
            postscale_factor=1.0)

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"reduce_op 7 is not supported\. Use "
                             r"tfring\.Average \(0\)"):
        step(tf.ones([2]))


def test_compilation_kernels_registered():
    tf.function(lambda x: x + 1, jit_compile=True)(tf.ones([1]))
    assert "XLA_CPU_JIT" in _jit_devices("Tfring>Allreduce")
    assert "XLA_CPU_JIT" in _jit_devices("Tfring>Broadcast")
    # On a GPU build the GPU compilation device gets kernels that fail with
    # a message naming jit_compile=False.
    if "XLA_GPU_JIT" in _jit_devices("Identity"):
        assert "XLA_GPU_JIT" in _jit_devices("Tfring>Allreduce")
    assert not _jit_devices("Tfring>Allgather")


def test_library_loaded_after_xla_initialised(rank):
    # TensorFlow registers XLA compilation kernels once per process; when a
    # jit-compiled function ran before `import tfring`, the op library must
    # register its own. A fresh process, outside MPI: tfring is not
    # initialised there, so the compiled custom call reports that at run time.
    if rank != 0:
        pytest.skip("one fresh process is enough; it runs on rank 0")
    script = (
        "import tensorflow as tf\n"
        "from tensorflow.python.framework import kernels\n"
        "tf.function(lambda x: x * 2, jit_compile=True)(tf.ones([2]))\n"
        "import tfring.ops  # the op library loads here\n"
        "devices = {k.device_type for k in "
        "kernels.get_registered_kernels_for_op('Tfring>Allreduce').kernel}\n"
        "assert 'XLA_CPU_JIT' in devices, devices\n"
        "f = tf.function(lambda x: tfring.ops.allreduce_op(x, 1),"
        " jit_compile=True)\n"
        "hlo = f.experimental_get_compiler_ir(tf.ones([2]))(stage='hlo')\n"
        "assert 'tfring_allreduce' in hlo, hlo\n"
        "try:\n"
        "    f(tf.ones([2]))\n"
        "except tf.errors.FailedPreconditionError as e:\n"
        "    assert 'tfring.init()' in e.message, e.message\n"
        "    print('NOT-INITIALIZED-OK')\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NOT-INITIALIZED-OK" in proc.stdout, proc.stderr[-3000:]


# ---------------------------------------------------------------------------
# Keras: model.compile(..., jit_compile=True) and fit
# ---------------------------------------------------------------------------

def _data(rank, batch=8):
    """Rank `rank`'s shard: deterministic, different on every rank."""
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(batch, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
         + 0.1 * rank).astype(np.float32)
    return x, y


def _model(model_class=None):
    import keras
    model_class = model_class or keras.Sequential
    model = model_class([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                         keras.layers.Dense(1)])
    # The same initial weights on every rank and in the reference.
    rng = np.random.default_rng(7)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) * 0.5
                       for w in model.get_weights()])
    return model


def _reference_weights(size, steps, batch=8):
    """One process, no tfring, no XLA, on every rank's data at once."""
    import keras
    x, y = zip(*[_data(r, batch) for r in range(size)])
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                  jit_compile=False)
    model.fit(np.concatenate(x), np.concatenate(y), batch_size=size * batch,
              epochs=steps, shuffle=False, verbose=0)
    return model.get_weights()


def _check_trained(model, size, steps):
    expected = _reference_weights(size, steps)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Bitwise identical on every rank.
    for w in model.get_weights():
        spread = (tfring.allreduce(w, op=tfring.Max)
                  - tfring.allreduce(w, op=tfring.Min))
        assert np.max(np.abs(spread.numpy())) == 0.0


def test_keras_fit_jit_compiled_train_step_with_grouped_allreduce(rank, size):
    import keras

    class AveragingModel(keras.Sequential):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            grads = tfring.grouped_allreduce(grads, op=tfring.Average)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    steps = 3
    model = _model(AveragingModel)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                  jit_compile=True)
    x, y = _data(rank)
    model.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)
    assert model.jit_compile
    _check_trained(model, size, steps)


def test_keras_jit_train_step_with_allgather_names_the_fix(rank, size):
    import keras

    class GatheringModel(keras.Sequential):
        def train_step(self, data):
            x, _ = data
            return {"rows": tf.shape(tfring.allgather(x))[0]}

    model = _model(GatheringModel)
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    x, y = _data(rank)
    with pytest.raises(ValueError, match=r"model\.compile\(\.\.\., jit_compile=False\)"):
        model.fit(x, y, batch_size=len(x), epochs=1, verbose=0)


@pytest.mark.skipif(not hasattr(tfring, "DistributedOptimizer"),
                    reason="tfring.DistributedOptimizer does not exist yet")
def test_keras_fit_jit_compiled_with_distributed_optimizer(rank, size):
    import keras
    steps = 3
    model = _model()
    model.compile(optimizer=tfring.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss="mse", jit_compile=True)
    x, y = _data(rank)
    model.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)
    assert model.jit_compile
    _check_trained(model, size, steps)


def _embedding_data(rank, batch=8):
    rng = np.random.default_rng(200 + rank)
    x = rng.integers(0, 10, size=(batch, 3)).astype(np.int32)
    y = rng.normal(size=(batch, 1)).astype(np.float32)
    return x, y


def _embedding_model():
    import keras
    model = keras.Sequential([keras.Input((3,), dtype="int32"),
                              keras.layers.Embedding(10, 4),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    rng = np.random.default_rng(9)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) * 0.5
                       for w in model.get_weights()])
    return model


@pytest.mark.skipif(not hasattr(tfring, "DistributedOptimizer"),
                    reason="tfring.DistributedOptimizer does not exist yet")
def test_keras_jit_embedding_adam_backward_passes_match_graph_mode(rank, size):
    # Embedding gradients are tf.IndexedSlices; with sparse_as_dense=True
    # they are allreduced densely, which XLA can compile. The aggregation
    # over backward passes runs in a tf.cond inside the compiled step.
    import keras
    x, y = _embedding_data(rank)
    trained = {}
    for jit in (True, False):
        model = _embedding_model()
        model.compile(optimizer=tfring.DistributedOptimizer(
            keras.optimizers.Adam(0.01), sparse_as_dense=True,
            backward_passes_per_step=2), loss="mse", jit_compile=jit)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        trained[jit] = model.get_weights()
    for with_xla, without in zip(trained[True], trained[False]):
        np.testing.assert_allclose(with_xla, without, rtol=1e-5, atol=1e-6)
    for w in trained[True]:
        spread = (tfring.allreduce(w, op=tfring.Max)
                  - tfring.allreduce(w, op=tfring.Min))
        assert np.max(np.abs(spread.numpy())) == 0.0


@pytest.mark.skipif(not hasattr(tfring, "DistributedOptimizer"),
                    reason="tfring.DistributedOptimizer does not exist yet")
def test_keras_jit_sparse_gradients_name_the_fixes(rank, size):
    import keras
    model = _embedding_model()
    model.compile(optimizer=tfring.DistributedOptimizer(
        keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    x, y = _embedding_data(rank)
    with pytest.raises(ValueError, match=r"sparse_as_dense=True") as info:
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert "jit_compile=False" in str(info.value)
