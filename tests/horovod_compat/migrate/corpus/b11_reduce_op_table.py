"""Metrics utility module style (as in in-house training libs): reduce-op constants
stored as values in a lookup table, and a `reduce_metric(t, how=...)` helper used
with several reductions.
"""
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict

import torch
import torch.nn as nn
import horovod.torch as hvd

REDUCERS = {
    "mean": hvd.Average,
    "sum": hvd.Sum,
    "max": hvd.Max,
    "min": hvd.Min,
}


def reduce_metric(t, how="mean"):
    if not torch.is_tensor(t):
        t = torch.tensor(t, dtype=torch.float64)
    return hvd.allreduce(t, op=REDUCERS[how])


@dataclass
class EpochMeter:
    loss_sum: float = 0.0
    n: int = 0
    worst: float = -math.inf
    best: float = math.inf
    extra: Dict[str, float] = field(default_factory=dict)

    def update(self, loss, bs):
        self.loss_sum += loss * bs
        self.n += bs
        self.worst = max(self.worst, loss)
        self.best = min(self.best, loss)

    def summarize(self):
        total = reduce_metric(torch.tensor([self.loss_sum, float(self.n)], dtype=torch.float64), how="sum")
        return {
            "loss": (total[0] / total[1]).item(),
            "samples": int(total[1].item()),
            "worst_batch": reduce_metric(self.worst, how="max").item(),
            "best_batch": reduce_metric(self.best, how="min").item(),
            "avg_best": reduce_metric(self.best).item(),
        }


class Quadratic(nn.Module):
    """y = x^T A x + b^T x, learned by a small MLP."""

    def __init__(self, d=6):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 48), nn.Softplus(), nn.Linear(48, 24), nn.Softplus(), nn.Linear(24, 1))

    def forward(self, x):
        return self.net(x).squeeze(1)


def data_for(rank, n=180, d=6):
    g = torch.Generator().manual_seed(4242 + rank * 13)
    A = torch.eye(d) * 0.5
    x = torch.randn(n, d, generator=g)
    y = ((x @ A) * x).sum(1) + x[:, 0] - x[:, 1]
    return x, y


if __name__ == "__main__":
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    x, y = data_for(hvd.rank())
    # rank-dependent batch size, so "sum" vs "mean" actually differ
    bs = 30 if hvd.rank() == 0 else 20
    model = Quadratic()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, nesterov=True, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=REDUCERS["mean"])

    steps_per_epoch = 6
    gstep = 0
    for epoch in range(2):
        meter = EpochMeter()
        for k in range(steps_per_epoch):
            xb = x[k * bs:(k + 1) * bs]
            yb = y[k * bs:(k + 1) * bs]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            gstep += 1
            meter.update(loss.item(), len(xb))
            print(f"CORPUS rank={hvd.rank()} step={gstep} loss={loss.item():.6f}", flush=True)
        summary = meter.summarize()
        if hvd.rank() == 0:
            print("epoch", epoch, {k: round(v, 4) for k, v in summary.items()}, flush=True)

    if hvd.rank() == 0:
        torch.save(model.state_dict(), os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b11.pt"))

    s = reduce_metric(sum(p.double().sum() for p in model.parameters()).detach(), how="max")
    local = sum(p.double().sum() for p in model.parameters()).item()
    assert abs(s.item() - local) < 1e-9, "replicas diverged"
    print(f"CORPUS rank={hvd.rank()} final={local:.6f}", flush=True)
