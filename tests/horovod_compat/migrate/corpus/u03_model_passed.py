"""Style: the model is built in one function, wrapped for Horovod in another,
and trained in a third; functions with type hints, model passed around."""
from typing import List, Tuple

import torch
import torch.nn as nn

import horovod.torch


def build_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv1d(1, 4, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 10, 1),
    )


def wrap_for_distributed(net: nn.Module, lr: float) -> torch.optim.Optimizer:
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    opt = horovod.torch.DistributedOptimizer(opt, named_parameters=net.named_parameters())
    horovod.torch.broadcast_parameters(net.state_dict(), root_rank=0)
    horovod.torch.broadcast_optimizer_state(opt, root_rank=0)
    return opt


def shard(rank: int, steps: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(500 + rank)
    batches = []
    for _ in range(steps):
        x = torch.randn(8, 1, 10, generator=g)
        batches.append((x, x.mean(dim=(1, 2)).unsqueeze(1)))
    return batches


def train(net: nn.Module, opt: torch.optim.Optimizer, batches) -> None:
    loss_fn = nn.MSELoss()
    rank = horovod.torch.rank()
    for step, (x, y) in enumerate(batches, start=1):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        print(f"CORPUS rank={rank} step={step} loss={loss.item():.6f}", flush=True)


def weight_sum(net: nn.Module) -> float:
    return float(sum(p.detach().sum() for p in net.parameters() if p.requires_grad))


def run() -> None:
    horovod.torch.init()
    net = build_model(seed=3)
    opt = wrap_for_distributed(net, lr=0.05)
    train(net, opt, shard(horovod.torch.rank(), steps=7))
    print(f"CORPUS rank={horovod.torch.rank()} final={weight_sum(net):.6f}", flush=True)


run()
