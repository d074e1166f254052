# tfring.torch.SyncBatchNorm: batch normalization whose training-mode
# statistics cover the batches of every rank, as horovod.torch's
# SyncBatchNorm; a drop-in for torch.nn.BatchNorm1d/2d/3d.
#
# Why this way: each rank reduces its batch to per-channel (count, mean,
# sum of squared deviations from that mean). One Sum-allreduce of a small
# table -- a row per rank, zero except this rank's -- hands every rank all
# rows, which combine into the global mean and variance without the
# cancellation of a sum of squares. The allreduce is tfring.torch's
# differentiable one, whose gradient (for Sum) is the gradient summed over
# ranks, so autograd gives each rank's input its share of the gradient of
# the sum of all ranks' losses -- what torch.nn.BatchNorm on the
# concatenated batch gives -- with no hand-written backward, on any device
# torch computes on. (Horovod defines allgather's gradient as an average,
# which would scale it by 1/size.) The gradients of weight and bias stay
# per rank, as in Horovod: DistributedOptimizer reduces them with the
# others. The table also carries a flag per rank for input it cannot
# normalize, so a bad batch on one rank raises on every rank instead of
# leaving the others waiting in the collective.

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from tfring.torch import basics
from tfring.torch.autograd_functions import allreduce
from tfring.torch.collectives import Sum

_STATISTICS_NAME = "sync_batch_norm.statistics"
# Columns of the statistics table; the means and the sums of squared
# deviations (num_features columns each) follow.
_FLAG, _COUNT, _FIRST_STATISTIC = 0, 1, 2


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over (N, C, ...) input whose training statistics are those
    of the batches of all ranks together.

    In training (and whenever `track_running_stats` is False) the mean and
    variance of each channel are computed over every rank's batch, which may
    differ in size between ranks (an empty batch on some ranks is fine), and
    gradients flow through them, so each rank gets what torch.nn.BatchNorm
    on the concatenation of all batches would give. The running statistics
    are updated as torch does, from the global statistics, so they are the
    same on every rank. In eval mode the running statistics are used and
    nothing is communicated. With one rank it is torch.nn.BatchNorm.

    Every rank must call forward (and backward) on its SyncBatchNorm layers
    in the same order.

    Args:
        num_features: C, the number of channels of the (N, C, ...) input.
        eps: added to the variance for numerical stability.
        momentum: weight of each batch in the running statistics; None for
            a cumulative average.
        affine: whether the layer has learnable weight and bias.
        track_running_stats: whether the layer keeps running statistics for
            eval mode.
        device: where to create the parameters and buffers.
        dtype: the dtype of the parameters and buffers.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats, device=device, dtype=dtype)

    def _check_input_dim(self, input):
        problem = _input_problem(input, self.num_features)
        if problem is not None:
            raise problem

    def forward(self, input):
        uses_batch_statistics = self.training or not self.track_running_stats
        if not uses_batch_statistics or basics.size() == 1:
            return super().forward(input)
        momentum = self._running_statistics_momentum()
        mean, variance, count = _global_statistics(input, self.num_features)
        if momentum is not None:
            self._update_running_statistics(mean, variance, count, momentum)
        return _normalize(input, mean, variance, self.weight, self.bias,
                          self.eps)

    def _running_statistics_momentum(self):
        """Counts this batch and returns its weight in the running
        statistics (torch's rule), or None when they are not updated."""
        if not (self.training and self.track_running_stats):
            return None
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    @torch.no_grad()
    def _update_running_statistics(self, mean, variance, count, momentum):
        unbiased_variance = variance * (count / (count - 1))
        for running, batch in ((self.running_mean, mean),
                               (self.running_var, unbiased_variance)):
            running.mul_(1.0 - momentum).add_(batch.to(running.dtype),
                                              alpha=momentum)


def _input_problem(input, num_features):
    """The ValueError that says what makes `input` unusable for a
    SyncBatchNorm of `num_features` channels, or None."""
    if not isinstance(input, torch.Tensor):
        return ValueError(
            f"SyncBatchNorm expected a torch.Tensor, got "
            f"{type(input).__name__}. Pass a tensor of shape (N, C, ...).")
    if input.dim() < 2:
        return ValueError(
            f"SyncBatchNorm expected input of at least 2 dimensions "
            f"(N, C, ...), got {input.dim()}D input of shape "
            f"{tuple(input.shape)}. Add the batch dimension, e.g. "
            f"input.unsqueeze(0).")
    if input.shape[1] != num_features:
        return ValueError(
            f"SyncBatchNorm expected {num_features} channels in dimension "
            f"1 of the input, got shape {tuple(input.shape)}. Pass "
            f"(N, {num_features}, ...) input or create the layer with "
            f"num_features={input.shape[1]}.")
    if not input.is_floating_point():
        return ValueError(
            f"SyncBatchNorm expected a floating-point input, got "
            f"{input.dtype}. Convert it first, e.g. input.float().")
    return None


def _statistics_dtype(input):
    """float64 input keeps its precision; the others accumulate in float32."""
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def _channel_shape(input):
    """The shape that broadcasts a per-channel vector over `input`."""
    return (1, -1) + (1,) * (input.dim() - 2)


def _local_row(input, num_features):
    """This rank's row of the statistics table: [flag, count, means...,
    sums of squared deviations...], differentiable with respect to input."""
    width = _FIRST_STATISTIC + 2 * num_features
    if _input_problem(input, num_features) is not None:
        row = torch.zeros(width, dtype=torch.float64)
        row[_FLAG] = 1.0
        return row
    values = input.to(_statistics_dtype(input))
    reduced_dims = [0] + list(range(2, values.dim()))
    count = values.numel() // num_features
    mean = values.sum(reduced_dims) / max(count, 1)
    deviations = values - mean.view(_channel_shape(values))
    squared_deviations = (deviations * deviations).sum(reduced_dims)
    header = torch.tensor([0.0, float(count)], dtype=torch.float64)
    return torch.cat([header, mean.to(torch.float64).cpu(),
                      squared_deviations.to(torch.float64).cpu()])


def _global_statistics(input, num_features):
    """The mean and (biased) variance of every channel over the batches of
    all ranks, and the number of values per channel they cover. Raises
    ValueError on every rank when any rank's input is unusable."""
    rank, size = basics.rank(), basics.size()
    row = _local_row(input, num_features)
    table = allreduce(F.pad(row.unsqueeze(0), (0, 0, rank, size - rank - 1)),
                      op=Sum, name=_STATISTICS_NAME)
    _raise_for_unusable_batches(input, num_features, table)
    counts = table[:, _COUNT].detach()
    total = counts.sum()
    means = table[:, _FIRST_STATISTIC:_FIRST_STATISTIC + num_features]
    squared_deviations = table[:, _FIRST_STATISTIC + num_features:]
    mean = (counts.unsqueeze(1) * means).sum(0) / total
    spread = means - mean
    variance = (squared_deviations
                + counts.unsqueeze(1) * spread * spread).sum(0) / total
    dtype = _statistics_dtype(input)
    return (mean.to(device=input.device, dtype=dtype),
            variance.to(device=input.device, dtype=dtype), float(total))


def _raise_for_unusable_batches(input, num_features, table):
    problem = _input_problem(input, num_features)
    if problem is not None:
        raise problem
    flagged = [r for r, flag in enumerate(table[:, _FLAG].tolist()) if flag]
    if flagged:
        raise ValueError(
            f"SyncBatchNorm could not normalize the batch because rank(s) "
            f"{flagged} passed input it cannot use (their own error says "
            f"why); every rank raises so that none waits for the others. "
            f"Fix the input on those ranks.")
    counts = [int(c) for c in table[:, _COUNT].tolist()]
    if sum(counts) < 2:
        raise ValueError(
            f"SyncBatchNorm expected more than 1 value per channel in "
            f"training over all ranks together, got {sum(counts)} (per rank: "
            f"{counts}). Use batches with more values, or eval() mode with "
            f"running statistics.")


def _normalize(input, mean, variance, weight, bias, eps):
    shape = _channel_shape(input)
    values = input.to(mean.dtype)
    output = (values - mean.view(shape)) * torch.rsqrt(variance.view(shape)
                                                       + eps)
    if weight is not None:
        output = output * weight.to(mean.dtype).view(shape)
    if bias is not None:
        output = output + bias.to(mean.dtype).view(shape)
    return output.to(input.dtype)
