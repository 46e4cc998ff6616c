"""Single-process simulations of the worked examples under Horovod's semantics on 2 ranks
(basic_training also on 1).

Horovod's DistributedOptimizer averages the two ranks' gradients before `step()`; with one
model that is the gradient of the mean of the two ranks' losses.  These functions replay each
example that way, with no torch.distributed at all, and return the lines rank 0 would print.
They make the golden traces independent evidence rather than a recording of the rewriter.
"""
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F


def basic_training(ranks: int = 2) -> List[str]:
    """On `ranks` ranks (1: the script run as one plain process, as Horovod ran it alone)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).long()
    torch.manual_seed(1234)  # rank 0's initial weights win the broadcast
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * ranks, momentum=0.9)
    shards = [torch.arange(r, 128, ranks) for r in range(ranks)]  # DistributedSampler, no shuffle
    lines, step = [], 0
    for _epoch in range(2):
        for b in range(0, 128 // ranks, 16):
            optimizer.zero_grad()
            losses = [F.cross_entropy(model(x[s[b:b + 16]]), y[s[b:b + 16]]) for s in shards]
            (sum(losses) / ranks).backward()
            optimizer.step()
            avg = sum(loss.detach() for loss in losses) / ranks
            lines.append(f"step {step} loss {losses[0].item():.6f} avg {avg.item():.6f}")
            step += 1
    return lines


def clipping_adam_metrics() -> List[str]:
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    # broadcast_optimizer_state on a fresh optimizer: one step on zero gradients first.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    gens = [torch.Generator().manual_seed(100 + r) for r in range(2)]
    lines = []
    for step in range(8):
        batches = []
        for g in gens:
            xb = torch.randn(32, 6, generator=g)
            yb = torch.randint(0, 3, (32,), generator=g)
            batches.append((xb, yb))
        optimizer.zero_grad()
        outs = [model(xb) for xb, _ in batches]
        losses = [F.cross_entropy(o, yb) for o, (_, yb) in zip(outs, batches)]
        ((losses[0] + losses[1]) / 2).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
        correct = [int((o.argmax(dim=1) == yb).sum()) for o, (_, yb) in zip(outs, batches)]
        lines.append(f"step {step} loss {losses[0].item():.6f} grad_norm {norm.item():.6f} "
                     f"correct {sum(correct)} mean_correct {sum(correct) // 2}")
    return lines


def gradient_accumulation() -> List[str]:
    passes = 3
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = []
    for r in range(2):
        gen = torch.Generator().manual_seed(200 + r)
        data.append([(torch.randn(8, 5, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(12)])
    lines = []
    for group in range(4):
        # Each rank sums the gradients of its 3 passes; Horovod averages those sums over ranks.
        for r in range(2):
            for i in range(group * passes, (group + 1) * passes):
                x, y = data[r][i]
                loss = F.mse_loss(model(x), y) / passes
                (loss / 2).backward()
                if r == 0:
                    last_loss = loss
        optimizer.step()
        optimizer.zero_grad()
        x, y = data[0][(group + 1) * passes - 1]
        with torch.no_grad():
            check = F.mse_loss(model(x), y)
        lines.append(f"step {group} loss {last_loss.item() * passes:.6f} after {check.item():.6f}")
    return lines


SIMULATIONS: Dict[str, Callable[[], List[str]]] = {
    "gradient_accumulation": gradient_accumulation,
    "basic_training": basic_training,
    "clipping_adam_metrics": clipping_adam_metrics,
}
