"""Style: config-driven research codebase: dataclass config -> build_model(cfg: dict) factory, optimizer picked by name from a registry dict.
"""
from dataclasses import asdict, dataclass, field
from typing import List

import torch
import torch.nn as nn

import horovod.torch as hvd

OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


@dataclass
class ModelConfig:
    in_dim: int = 8
    hidden: List[int] = field(default_factory=lambda: [16, 16])
    out_dim: int = 2
    dropout: float = 0.0
    activation: str = "relu"


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    kwargs: dict = field(default_factory=lambda: {"weight_decay": 0.05, "betas": (0.9, 0.98)})


@dataclass
class ExperimentConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    steps: int = 5
    batch_size: int = 12
    seed: int = 11


ACTIVATIONS = {"relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


def build_model(cfg: dict) -> nn.Module:
    layers = []
    dims = [cfg["in_dim"]] + list(cfg["hidden"])
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), ACTIVATIONS[cfg["activation"]]()]
        if cfg["dropout"] > 0:
            layers.append(nn.Dropout(cfg["dropout"]))
    layers.append(nn.Linear(dims[-1], cfg["out_dim"]))
    return nn.Sequential(*layers)


def build_optimizer(model: nn.Module, cfg: OptimConfig):
    opt_cls = OPTIMIZERS[cfg.name]
    base = opt_cls(model.parameters(), lr=cfg.lr * hvd.size(), **cfg.kwargs)
    return hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())


def main():
    cfg = ExperimentConfig()
    hvd.init()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)

    model = build_model(asdict(cfg.model))
    optimizer = build_optimizer(model, cfg.optim)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator()
    gen.manual_seed(cfg.seed * 1000 + hvd.rank())
    criterion = nn.CrossEntropyLoss()
    for step in range(cfg.steps):
        x = torch.randn(cfg.batch_size, cfg.model.in_dim, generator=gen)
        y = (x[:, 0] + x[:, 1] > 0).long()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
