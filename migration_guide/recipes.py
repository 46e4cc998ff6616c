"""Native replacements for the Horovod features the rewriter leaves as TODO (see differences.md).

Copy what you need. Each function is exercised on 2 ranks by
tests/horovod_compat/migrate/test_migrate_recipes.py, against Horovod's documented behaviour.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Tuple

import torch
import torch.distributed as dist


def allgather_varsize(tensor: torch.Tensor) -> torch.Tensor:
    """``hvd.allgather``: concatenate every rank's tensor along dim 0; dim 0 may differ by rank.

    ``dist.all_gather`` needs equal shapes, so the sizes are gathered first and every tensor is
    padded to the largest.  Not differentiable (Horovod's was).
    """
    world = dist.get_world_size()
    size = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.shape[0]] = tensor
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat([g[: int(s.item())] for g, s in zip(gathered, sizes)])


def train_accumulating(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    passes_per_step: int,
) -> None:
    """``DistributedOptimizer(..., backward_passes_per_step=n)`` on DDP.

    Horovod summed the local gradients of n backward passes and averaged the sum across ranks on
    the n-th; DDP does the same when the first n-1 backward passes run under ``no_sync()``.
    """
    for i, (x, y) in enumerate(batches):
        last = (i + 1) % passes_per_step == 0
        with contextlib.nullcontext() if last else ddp_model.no_sync():
            loss_fn(ddp_model(x), y).backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
