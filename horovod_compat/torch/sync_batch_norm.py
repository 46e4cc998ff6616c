"""``hvd.SyncBatchNorm``: batch normalization with statistics over the whole distributed batch.

Horovod 0.28.1 implements it with CUDA-only kernels (on CPU it raises ``ValueError``).  Here it
works on CPU and GPU alike, with ordinary differentiable tensor ops: each rank sums ``x`` and ``x*x``
per channel (in float64, for a stable variance) together with its element count, one differentiable
``all_reduce`` (``torch.distributed.nn.functional.all_reduce``: its backward is an ``all_reduce``
of the gradient) gives the global mean and variance, and autograd derives the exact backward --
the input gradient of a batch norm over the concatenated batch.  Weight and bias gradients stay
local sums, to be averaged by ``DistributedOptimizer`` like any other gradient (as with torch's
``SyncBatchNorm``).  Ranks may hold different batch sizes.

Evaluation mode, and jobs of size 1, use plain batch norm with the running statistics / local batch.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from horovod_compat.common import lifecycle, ops
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from . import collectives

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Drop-in ``BatchNorm{1,2,3}d`` whose training statistics span every rank of the process set.

    Arguments are those of ``torch.nn.BatchNorm2d`` (and Horovod's ``SyncBatchNorm``), plus
    ``process_set`` (default: the global set).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_set: ProcessSet = global_process_set,
                 device: Any = None, dtype: Any = None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def _factor(self) -> float:
        """Momentum of this update; None momentum = cumulative average (as ``_BatchNorm``)."""
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                return 1.0 / float(self.num_batches_tracked)
            return self.momentum
        return 0.0 if self.momentum is None else self.momentum

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        process_set = self.process_set
        if not use_batch_stats or not lifecycle.is_initialized() or process_set.size() == 1:
            return super().forward(input)
        factor = self._factor()
        c = input.size(1)
        dims = [0] + list(range(2, input.dim()))
        count = input.numel() // c
        stats = torch.cat([input.sum(dims, dtype=torch.float64),
                           (input * input).sum(dims, dtype=torch.float64),
                           torch.tensor([float(count)], dtype=torch.float64, device=input.device)])
        # through the coordinator (differentiable: the gradient is reduced the same way)
        total = collectives.allreduce(stats, op=ops.Sum, process_set=process_set)
        n = total[2 * c]
        mean = total[:c] / n
        var = (total[c:2 * c] / n - mean * mean).clamp_min(0.0)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                n_val = float(n.item())
                unbiased = var * (n_val / max(n_val - 1.0, 1.0))
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        shape = [1, c] + [1] * (input.dim() - 2)
        invstd = torch.rsqrt(var + self.eps)
        scale = invstd.to(input.dtype).view(shape)
        out = (input - mean.to(input.dtype).view(shape)) * scale
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

