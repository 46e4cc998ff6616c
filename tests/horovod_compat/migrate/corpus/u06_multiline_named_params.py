"""Style: dataclass config, a Runner class where named_parameters= is written
over several lines as a method chain split inside parentheses."""
from dataclasses import dataclass

import torch
import torch.nn as nn

import horovod.torch as hvd


@dataclass
class Config:
    in_dim: int = 5
    hidden: int = 10
    lr: float = 0.02
    steps: int = 9
    batch_size: int = 8
    seed: int = 99


class Runner:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.network = nn.Sequential(
            nn.Linear(cfg.in_dim, cfg.hidden),
            nn.GELU(),
            nn.Linear(cfg.hidden, 1),
        )
        base = torch.optim.RMSprop(self.network.parameters(), lr=cfg.lr)
        self.optimizer = hvd.DistributedOptimizer(
            base,
            named_parameters=
            self.network.
            named_parameters(),
        )
        hvd.broadcast_parameters(
            self.network.state_dict(),
            root_rank=0,
        )

    def batches(self):
        g = torch.Generator().manual_seed(self.cfg.seed + hvd.rank())
        w = torch.arange(1, self.cfg.in_dim + 1, dtype=torch.float32)
        for _ in range(self.cfg.steps):
            x = torch.randn(self.cfg.batch_size, self.cfg.in_dim, generator=g)
            yield x, (x @ w).unsqueeze(1) / 10

    def train(self):
        for step, (x, y) in enumerate(self.batches(), 1):
            self.optimizer.zero_grad()
            loss = nn.functional.mse_loss(self.network(x), y)
            loss.backward()
            self.optimizer.step()
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        total = sum(
            p.detach().sum().item()
            for p in self.network.parameters()
            if p.requires_grad
        )
        print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    hvd.init()
    Runner(Config()).train()
