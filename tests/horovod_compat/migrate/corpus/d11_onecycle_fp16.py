"""Tabular regression trainer in the style of fastai-inspired scripts: OneCycle policy on
the wrapped optimizer and fp16 gradient compression toggled from a namespace config."""
import os
import sys
import tempfile
from types import SimpleNamespace

import torch
from torch import nn
import horovod.torch as hvd

_DEFAULTS = """
epochs: 4
steps_per_epoch: 5
batch_size: 32
max_lr: 0.02
pct_start: 0.3
wd: 0.0
fp16: true
n_features: 14
hidden: 64
seed: 2718
"""


def load_cfg(text=_DEFAULTS, overrides=()):
    """poor man's YAML: key: value per line, with CLI-style key=value overrides"""
    raw = {}
    for line in text.strip().splitlines():
        k, v = [s.strip() for s in line.split(":", 1)]
        raw[k] = v
    for ov in overrides:
        k, v = ov.split("=", 1)
        raw[k.lstrip("-")] = v

    def conv(v):
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        for typ in (int, float):
            try:
                return typ(v)
            except ValueError:
                pass
        return v
    return SimpleNamespace(**{k: conv(v) for k, v in raw.items()})


class ResidualRegressor(nn.Module):
    def __init__(self, n_in, hidden):
        super().__init__()
        self.inp = nn.Linear(n_in, hidden)
        self.block = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden // 2), nn.GELU(),
                                   nn.Linear(hidden // 2, hidden))
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.inp(x)
        h = h + self.block(h)
        return self.out(h).squeeze(-1)


def make_data(cfg, rank):
    g = torch.Generator().manual_seed(cfg.seed + 10007 * rank)
    w = torch.randn(cfg.n_features, generator=torch.Generator().manual_seed(cfg.seed))
    n = cfg.steps_per_epoch * cfg.batch_size
    x = torch.randn(n, cfg.n_features, generator=g)
    y = x @ w + 0.5 * torch.sin(x[:, 0] * 2) + 0.1 * torch.randn(n, generator=g)
    return x, (y - y.mean()) / y.std()


def run(cfg):
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(cfg.seed)

    x, y = make_data(cfg, hvd.rank())
    model = ResidualRegressor(cfg.n_features, cfg.hidden)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.max_lr, weight_decay=cfg.wd)
    compression = hvd.Compression.fp16 if cfg.fp16 else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.max_lr * hvd.size(), epochs=cfg.epochs,
        steps_per_epoch=cfg.steps_per_epoch, pct_start=cfg.pct_start)

    loss_fn = nn.MSELoss()
    it = 0
    for ep in range(cfg.epochs):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(ep * 13 + hvd.rank()))
        for b in range(cfg.steps_per_epoch):
            idx = perm[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            sched.step()
            print(f"CORPUS rank={hvd.rank()} step={it} loss={loss.item():.6f}", flush=True)
            it += 1
        if hvd.rank() == 0:
            sys.stderr.write(f"epoch {ep} lr={sched.get_last_lr()[0]:.6f}\n")

    total = sum(p.detach().double().sum() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={float(total):.6f}", flush=True)
    if hvd.rank() == 0:
        out_dir = os.environ.get("CORPUS_TMP", tempfile.gettempdir())
        torch.save(model.state_dict(), os.path.join(out_dir, "regressor_onecycle.pt"))


if __name__ == "__main__":
    run(load_cfg(overrides=sys.argv[1:]))
