# PowerSGD: low-rank gradient compression with error feedback (Vogels,
# Karimireddy and Jaggi, NeurIPS 2019), for DistributedGradientTape and the
# Keras DistributedOptimizer.
#
# Why: between hosts the network bounds data-parallel training. A matrix
# gradient M (n x m) is sent as two thin factors, P = M Q (n x r) and
# Q = M^T P (m x r): (n + m) r values instead of n m. What the
# approximation misses on this rank is kept (error feedback) and added to
# the next step's gradient, so nothing is lost, only delayed. The semantics
# follow PyTorch DDP's powerSGD_hook, which users know: rank r, warm-started
# Q (one power iteration per step), per-rank error feedback, vectors and
# tensors too small to gain sent uncompressed, `start_iter` steps of plain
# allreduce first, P orthogonalised between the two allreduces.
#
# How: built on grouped_allreduce (two per step: the P factors together
# with the uncompressed gradients, then the Q factors), so the core fuses
# each round. The state (step, Q and error of each gradient) is tf.Variables
# of this tf.Module: a tf.train.Checkpoint that holds the PowerSGD object
# saves and restores it (restoration waits until the first step creates the
# variables).

import tensorflow as tf

from tfring import collectives
from tfring.compressors import PowerSGDSettings
from tfring.process_sets import global_process_set


class PowerSGD(tf.Module, PowerSGDSettings):
    """Pass as `compression=` to tfring.DistributedGradientTape or
    tfring.keras.DistributedOptimizer (one PowerSGD object per model).

    Args:
      rank: the rank r of each gradient's approximation (1 to a few dozen;
        higher is closer to the exact average and sends more).
      start_iter: steps of plain (uncompressed) allreduce before compression
        starts, as DDP's start_powerSGD_iter; error feedback starts with it.
      min_compression_rate: a gradient is compressed only when that divides
        its traffic by more than this; others (and every vector) are
        averaged uncompressed.
      use_error_feedback: keep what the approximation missed and add it to
        the next step's gradient (recommended).
      warm_start: start each step's power iteration from the last step's Q
        (else from a fresh random Q, the same on every rank).
      orthogonalization_epsilon: added to the norms when orthogonalising P
        (0 as in DDP; a small value guards all-zero columns).
      seed: the seed of the initial random Q (identical on every rank).
    """

    api_name = "tfring.PowerSGD"
    accepted_by = ("tfring.DistributedGradientTape or "
                   "tfring.keras.DistributedOptimizer")
    wire_alternative = "tfring.Compression.bf16_wire"

    def __init__(self, rank=1, start_iter=10, min_compression_rate=2.0,
                 use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0.0, seed=0, name="powersgd"):
        super().__init__(name=name)
        self._configure(rank, start_iter, min_compression_rate,
                        use_error_feedback, warm_start,
                        orthogonalization_epsilon, seed)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        # Per gradient position ("g<i>"): Q (columns x r) and the error.
        self.factors = {}
        self.errors = {}
        # Arrays read from a saved Keras model before the first step made
        # the variables they belong to (see restore_saved_arrays).
        self._restored_arrays = {}

    # --- Keras saving: DistributedOptimizer.get_config / save_own_variables

    def get_config(self):
        """The constructor's arguments (the Keras DistributedOptimizer's
        config holds them, so a loaded model compresses the same way)."""
        return {"rank": self.matrix_rank, "start_iter": self.start_iter,
                "min_compression_rate": self.min_compression_rate,
                "use_error_feedback": self.use_error_feedback,
                "warm_start": self.warm_start,
                "orthogonalization_epsilon": self.epsilon,
                "seed": self.seed, "name": self.name}

    def saved_arrays(self):
        """The state as named arrays, for a Keras weights store."""
        arrays = {"powersgd.step": self.step.numpy()}
        for key in self.factors:
            arrays[f"powersgd.q.{key}"] = self.factors[key].numpy()
            arrays[f"powersgd.error.{key}"] = self.errors[key].numpy()
        return arrays

    def restore_saved_arrays(self, arrays):
        """Takes back what saved_arrays() gave; the Q and error of a
        gradient that has no variable yet are set when the first step makes
        it (a loaded model has not run a step)."""
        for name, value in arrays.items():
            if name == "powersgd.step":
                self.step.assign(int(value))
                continue
            _, kind, key = name.split(".", 2)
            variables = self.factors if kind == "q" else self.errors
            if key in variables:
                _assign_saved(variables[key], value, name)
            else:
                self._restored_arrays[name] = value

    def _matrix_shape(self, gradient):
        shape = gradient.shape
        if shape.rank is None or shape.rank < 2 or not shape.is_fully_defined():
            return None
        # Keras keeps the output dimension last (Dense (in, out), Conv2D
        # (h, w, in, out)): the matrix is (everything else) x outputs.
        columns = int(shape[-1])
        rows = int(shape.num_elements()) // max(columns, 1)
        rank = min(self.matrix_rank, rows, columns)
        if not self.compresses(rows, columns, rank):
            return None
        return rows, columns, rank

    def _state(self, key, gradient, rows, columns, rank):
        """The Q and error variables of gradient `key` (made on first use,
        outside any tf.function, so a traced step may create them)."""
        if key not in self.factors:
            with tf.init_scope():
                initial_q = tf.random.stateless_normal(
                    (columns, rank), seed=[self.seed, len(self.factors)],
                    dtype=gradient.dtype)
                self.factors[key] = tf.Variable(initial_q, trainable=False,
                                                name=f"q_{key}")
                self.errors[key] = tf.Variable(
                    tf.zeros((rows, columns), gradient.dtype), trainable=False,
                    name=f"error_{key}")
                for kind, variable in (("q", self.factors[key]),
                                       ("error", self.errors[key])):
                    name = f"powersgd.{kind}.{key}"
                    if name in self._restored_arrays:
                        _assign_saved(variable, self._restored_arrays.pop(name), name)
        return self.factors[key], self.errors[key]

    def reduce_gradient_list(self, grads, keys, reduce_args):
        """The average of `grads` (dense tensors; `keys` name their
        positions, stable across steps) over the ranks of
        reduce_args["process_set"], with the settings of `reduce_args`
        (op, scale factors)."""
        grads = [tf.convert_to_tensor(g) for g in grads]
        shapes = [self._matrix_shape(g) for g in grads]
        states = [self._state(k, g, *s) if s is not None else None
                  for k, g, s in zip(keys, grads, shapes)]
        op = reduce_args.get("op", collectives.Average)
        args = dict(op=op, process_set=reduce_args.get("process_set", global_process_set),
                    prescale_factor=reduce_args.get("prescale_factor", 1.0),
                    postscale_factor=reduce_args.get("postscale_factor", 1.0))

        def plain():
            return collectives.grouped_allreduce(grads, name=f"{self.name}.plain", **args)

        def compressed():
            return self._compressed(grads, shapes, states, args)

        if tf.executing_eagerly():
            reduced = plain() if int(self.step.numpy()) < self.start_iter else compressed()
        else:
            reduced = tf.cond(self.step < self.start_iter, plain, compressed)
        with tf.control_dependencies([tf.identity(r) for r in reduced]):
            self.step.assign_add(1)
        return [tf.identity(r) for r in reduced]

    def _compressed(self, grads, shapes, states, args):
        positions = [i for i, s in enumerate(shapes) if s is not None]
        plain_positions = [i for i, s in enumerate(shapes) if s is None]
        matrices, ps = {}, {}
        for i in positions:
            rows, columns, rank = shapes[i]
            q_var, error = states[i]
            g = tf.reshape(grads[i], (rows, columns))
            # M = gradient + error, a tensor of its own: the error variable
            # changes only at the end, once both allreduces have succeeded,
            # so a step that fails between them (an elastic reset) leaves
            # it as it was, and the step run again adds its gradient once.
            matrices[i] = tf.add(error, g) if self.use_error_feedback else g
            q = q_var if self.warm_start else tf.random.stateless_normal(
                (columns, rank), seed=tf.stack([tf.cast(self.seed, tf.int64), self.step]),
                dtype=g.dtype)
            ps[i] = tf.matmul(matrices[i], q)
        # Same-typed factors travel and are orthogonalised as one tall
        # matrix: a few ops for all matrices, not dozens per matrix.
        batches = _batches(positions, grads, shapes)
        # Round 1: the P factors and the uncompressed gradients together.
        # P's scale does not matter (it is orthogonalised); Average keeps it
        # in range.
        first = ([grads[i] for i in plain_positions]
                 + [tf.concat([ps[i] for i in batch], 0) for batch in batches])
        first_reduced = collectives.grouped_allreduce(
            first, name=f"{self.name}.p", **args) if first else []
        out = list(grads)
        for i, r in zip(plain_positions, first_reduced):
            out[i] = r
        if not ps:
            return out
        # Round 2: Q = M^T P per rank, averaged: P Q^T then approximates the
        # average of the ranks' M (a Sum is that times the set's size).
        p_orthogonal = {}
        for batch, p in zip(batches, first_reduced[len(plain_positions):]):
            rows = [shapes[i][0] for i in batch]
            p = _orthogonalize_stacked(p, rows, self.epsilon)
            p_orthogonal.update(zip(batch, tf.split(p, rows, axis=0)))
        # M^T P is computed as (P^T M)^T: on CPU the product with the thin
        # factor on the left is about 1.6x faster (ResNet-50's set: 15 ms
        # against 24 on one core).
        q_stacked = [tf.concat([tf.transpose(tf.matmul(p_orthogonal[i], matrices[i],
                                                       transpose_a=True))
                                for i in batch], 0) for batch in batches]
        q_reduced = collectives.grouped_allreduce(
            q_stacked, name=f"{self.name}.q", op=collectives.Average,
            process_set=args["process_set"])
        scale = (float(args["process_set"].size()) if int(args["op"]) == int(collectives.Sum)
                 else 1.0)
        updates = []
        for batch, q_batch in zip(batches, q_reduced):
            for i, q in zip(batch, tf.split(q_batch, [shapes[i][1] for i in batch], axis=0)):
                approximation = tf.matmul(p_orthogonal[i], q, transpose_b=True)
                q_var, error = states[i]
                if self.use_error_feedback:
                    # error = M - P Q^T, after the second allreduce (P Q^T
                    # depends on it). In a tf.function the subtraction
                    # writes into M's buffer (its last use) and the
                    # variable takes that buffer: no copy.
                    updates.append(error.assign(matrices.pop(i) - approximation,
                                                read_value=False))
                if self.warm_start:
                    updates.append(q_var.assign(q, read_value=False))
                if scale != 1.0:
                    approximation = approximation * scale
                out[i] = tf.reshape(approximation, grads[i].shape)
        with tf.control_dependencies(updates):
            return [tf.identity(t) for t in out]


def _batches(positions, grads, shapes):
    """The compressed positions grouped by (dtype, rank): the factors of a
    group are stacked along their rows."""
    groups = {}
    for i in positions:
        groups.setdefault((grads[i].dtype, shapes[i][2]), []).append(i)
    return list(groups.values())


def _orthogonalize_stacked(p, rows, epsilon):
    """Gram-Schmidt on the columns of each matrix stacked in `p` (matrix k
    is rows[k] rows of it), as DDP's hook does for each P: every column
    minus its projections on the earlier ones, divided by its norm
    (+ epsilon). Segment sums give every matrix's dot products at once."""
    segments = tf.repeat(tf.range(len(rows)), rows)
    done = []
    for i in range(p.shape[1]):
        column = p[:, i]
        for earlier in done:
            dots = tf.math.segment_sum(earlier * column, segments)
            column -= tf.gather(dots, segments) * earlier
        norms = tf.sqrt(tf.math.segment_sum(column * column, segments))
        done.append(column / tf.gather(norms + epsilon, segments))
    return tf.stack(done, axis=1)


def _assign_saved(variable, value, name):
    if tuple(variable.shape) != tuple(value.shape):
        raise ValueError(
            f"tfring.PowerSGD cannot restore '{name}': the saved model holds "
            f"shape {tuple(value.shape)}, but this model's gradient needs "
            f"{tuple(variable.shape)}. Expected the model that was saved, "
            "with the same layers in the same order. Load it into that "
            "model, or pass compression= to tfring.keras.load_model() to "
            "start a new PowerSGD state.")
    variable.assign(value)
