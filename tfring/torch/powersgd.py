# PowerSGD for tfring.torch.DistributedOptimizer: low-rank gradient
# compression with error feedback (Vogels, Karimireddy and Jaggi, NeurIPS
# 2019), with the semantics of DDP's powerSGD_hook (rank r, warm-started Q,
# per-rank error feedback, vectors and tensors too small to gain sent
# uncompressed, `start_iter` plain steps first, P orthogonalised between the
# two allreduces).
#
# Why here and not as a per-tensor compressor: one power iteration needs two
# allreduce rounds over all matrix gradients (the P factors, then the Q
# factors), so the optimizer hands PowerSGD the whole gradient list when it
# synchronizes, and PowerSGD runs two grouped allreduces (the core fuses
# each round). The state (step, Q and error per parameter) is saved and
# restored with state_dict() / load_state_dict(), as torch users do with
# optimizers.

import torch

from tfring.compressors import PowerSGDSettings
from tfring.process_sets import global_process_set
from tfring.torch import collectives as _c
from tfring.torch.handles import synchronize


def _grouped_allreduce(tensors, name, **args):
    return list(synchronize(_c.grouped_allreduce_async(tensors, name=name, **args)))


class PowerSGD(PowerSGDSettings):
    """Pass as `compression=` to tfring.torch.DistributedOptimizer (one
    PowerSGD object per optimizer). Arguments as DDP's PowerSGDState:
    `rank` (matrix_approximation_rank), `start_iter` (start_powerSGD_iter),
    `min_compression_rate`, `use_error_feedback`, `warm_start`,
    `orthogonalization_epsilon`, `seed` (of the initial random Q, identical on
    every rank)."""

    api_name = "tfring.torch.PowerSGD"
    accepted_by = "tfring.torch.DistributedOptimizer"
    wire_alternative = "tfring.torch.Compression.bf16_wire"

    def __init__(self, rank=1, start_iter=10, min_compression_rate=2.0,
                 use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0.0, seed=0):
        self._configure(rank, start_iter, min_compression_rate,
                        use_error_feedback, warm_start,
                        orthogonalization_epsilon, seed)
        self.step = 0
        self.factors = {}  # parameter name -> Q (columns x r)
        self.errors = {}   # parameter name -> this rank's error (rows x columns)

    def state_dict(self):
        return {"step": self.step,
                "factors": {k: v.clone() for k, v in self.factors.items()},
                "errors": {k: v.clone() for k, v in self.errors.items()}}

    def load_state_dict(self, state):
        self.step = int(state["step"])
        self.factors = {k: v.clone() for k, v in state["factors"].items()}
        self.errors = {k: v.clone() for k, v in state["errors"].items()}

    def matrix_shape(self, gradient):
        """(rows, columns, rank) when `gradient` is compressed, else None."""
        if gradient.dim() < 2 or not gradient.dtype.is_floating_point:
            return None
        rows = gradient.shape[0]
        columns = gradient.numel() // max(rows, 1)
        rank = min(self.matrix_rank, rows, columns)
        if not self.compresses(rows, columns, rank):
            return None
        return rows, columns, rank

    def _initial_q(self, key_index, columns, rank, dtype):
        generator = torch.Generator().manual_seed(self.seed * 1000003 + key_index)
        return torch.randn(columns, rank, generator=generator).to(dtype)

    def _orthogonalize(self, p):
        """Gram-Schmidt on P's columns, in place (as DDP's hook)."""
        for i in range(p.shape[1]):
            column = p[:, i]
            if i:
                column -= p[:, :i] @ (p[:, :i].T @ column)
            column /= column.norm() + self.epsilon

    def reduce_gradient_list(self, grads, keys, op, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
        """The reductions of `grads` (dense tensors, same list on every rank;
        `keys` name them, stable across steps) with `op` (Average or Sum)
        over `process_set`; returns new tensors."""
        args = dict(op=op, prescale_factor=prescale_factor,
                    postscale_factor=postscale_factor, process_set=process_set)
        if self.step < self.start_iter or not grads:
            self.step += 1
            return _grouped_allreduce(grads, "powersgd.plain", **args) if grads else []
        shapes = [self.matrix_shape(g) for g in grads]
        matrices, ps = {}, {}
        for i, (key, g, shape) in enumerate(zip(keys, grads, shapes)):
            if shape is None:
                continue
            rows, columns, rank = shape
            m = g.reshape(rows, columns).clone()
            if self.use_error_feedback:
                error = self.errors.get(key)
                if error is not None:
                    m += error
            if key not in self.factors or not self.warm_start:
                self.factors[key] = self._initial_q(
                    i + (0 if self.warm_start else 7919 * self.step), columns, rank, g.dtype)
            matrices[i] = m
            ps[i] = m @ self.factors[key]
        plain = [i for i, s in enumerate(shapes) if s is None]
        order = sorted(ps)
        # Round 1: the uncompressed gradients and the P factors together.
        first = _grouped_allreduce([grads[i] for i in plain] + [ps[i] for i in order],
                                   "powersgd.p", **args)
        out = list(grads)
        for i, r in zip(plain, first):
            out[i] = r
        if order:
            reduced_ps = first[len(plain):]
            for p in reduced_ps:
                self._orthogonalize(p)
            qs = [matrices[i].T @ p for i, p in zip(order, reduced_ps)]
            # Round 2: Q averaged, so P Q^T approximates the ranks' average.
            qs = _grouped_allreduce(qs, "powersgd.q", op=_c.Average,
                                    process_set=process_set)
            scale = float(process_set.size()) if op == _c.Sum else 1.0
            for i, p, q in zip(order, reduced_ps, qs):
                approximation = p @ q.T
                if self.use_error_feedback:
                    self.errors[keys[i]] = matrices[i] - approximation
                self.factors[keys[i]] = q
                out[i] = (approximation * scale).reshape(grads[i].shape)
        self.step += 1
        return out
