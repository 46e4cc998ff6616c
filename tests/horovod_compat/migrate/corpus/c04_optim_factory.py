"""Tabular classifier whose optimizer comes out of a config-driven factory (kwargs splatted into
hvd.DistributedOptimizer). Imitates "trainer framework" style code from applied-ML teams.
"""
import argparse
import json
import logging
import os
import tempfile
from typing import Any, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd

log = logging.getLogger(__name__)

DEFAULT_CFG = {
    "model": {"in_features": 12, "hidden": [48, 24], "n_classes": 3, "dropout": 0.0},
    "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4},
    "train": {"steps": 10, "batch_size": 16, "seed": 42},
}

OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "rmsprop": torch.optim.RMSprop,
}


class MLP(nn.Module):
    def __init__(self, in_features, hidden, n_classes, dropout=0.0):
        super().__init__()
        dims = [in_features] + list(hidden)
        self.blocks = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.drop = nn.Dropout(dropout)
        self.cls = nn.Linear(dims[-1], n_classes)

    def forward(self, x):
        for blk in self.blocks:
            x = self.drop(F.gelu(blk(x)))
        return self.cls(x)


def build_optimizer(model: nn.Module, name: str = "sgd", lr: float = 0.01,
                    scale_lr: bool = True, **kwargs: Any) -> torch.optim.Optimizer:
    """Create the base optimizer from config and wrap it for Horovod."""
    cls = OPTIMIZERS[name.lower()]
    if name.lower() != "sgd":
        kwargs.pop("momentum", None)
        kwargs.pop("nesterov", None)
    if scale_lr:
        lr = lr * hvd.size()
    base_opt = cls(model.parameters(), lr=lr, **kwargs)
    opt_kwargs = dict(named_parameters=model.named_parameters(),
                      compression=hvd.Compression.none)
    return hvd.DistributedOptimizer(base_opt, **opt_kwargs)


def synthetic_tabular(n: int, d: int, k: int, gen: torch.Generator):
    W = torch.randn(d, k, generator=torch.Generator().manual_seed(7))  # shared "ground truth"
    X = torch.randn(n, d, generator=gen)
    y = (X @ W + 0.5 * torch.randn(n, k, generator=gen)).argmax(1)
    return X, y


def run(cfg: Dict[str, Any]) -> None:
    tcfg = cfg["train"]
    torch.manual_seed(tcfg["seed"])
    model = MLP(**cfg["model"])
    optimizer = build_optimizer(model, **cfg["optim"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(tcfg["seed"] + hvd.rank())
    X, y = synthetic_tabular(tcfg["batch_size"] * tcfg["steps"], cfg["model"]["in_features"],
                             cfg["model"]["n_classes"], gen)

    model.train()
    for step in range(tcfg["steps"]):
        sl = slice(step * tcfg["batch_size"], (step + 1) * tcfg["batch_size"])
        xb, yb = X[sl], y[sl]
        optimizer.zero_grad()
        out = model(xb)
        loss = F.cross_entropy(out, yb)
        loss.backward()
        optimizer.step()
        acc = (out.argmax(1) == yb).float().mean()
        print("CORPUS rank={} step={} loss={:.6f}".format(hvd.rank(), step + 1, loss.item()),
              flush=True)
        log.debug("step %d acc %.3f", step, acc.item())

    metrics_path = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()),
                                "c04_metrics_rank%d.json" % hvd.rank())
    with open(metrics_path, "w") as fh:
        json.dump({"last_loss": loss.item(), "cfg": cfg}, fh)

    final = sum(p.detach().double().sum() for p in model.parameters()).item()
    print("CORPUS rank={} final={:.6f}".format(hvd.rank(), final), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None, help="optional JSON overriding DEFAULT_CFG")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO)
    config = json.loads(json.dumps(DEFAULT_CFG))
    if a.config:
        with open(a.config) as f:
            for section, vals in json.load(f).items():
                config.setdefault(section, {}).update(vals)
    run(config)
