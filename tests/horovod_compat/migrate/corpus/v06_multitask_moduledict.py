"""Style: multi-task model: shared encoder + nn.ModuleDict of task heads, loss summed over heads, named_parameters passed as a list comprehension.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd

TASKS = {"sentiment": 3, "topic": 5, "toxicity": 2}


class MultiTaskModel(nn.Module):
    def __init__(self, in_dim=20, hidden=32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.LayerNorm(hidden))
        self.heads = nn.ModuleDict({name: nn.Linear(hidden, n) for name, n in TASKS.items()})

    def forward(self, x):
        h = self.encoder(x)
        return {name: head(h) for name, head in self.heads.items()}


def main():
    hvd.init()
    torch.manual_seed(99)
    torch.set_num_threads(1)

    model = MultiTaskModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3 * hvd.size())
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=[(name, param) for name, param in model.named_parameters()
                          if param.requires_grad],
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    g = torch.Generator().manual_seed(500 + hvd.rank())
    task_weights = {"sentiment": 1.0, "topic": 0.5, "toxicity": 2.0}
    for step in range(1, 7):
        x = torch.randn(8, 20, generator=g)
        labels = {t: torch.randint(0, n, (8,), generator=g) for t, n in TASKS.items()}
        optimizer.zero_grad()
        logits = model(x)
        losses = {t: F.cross_entropy(logits[t], labels[t]) for t in TASKS}
        loss = sum(task_weights[t] * l for t, l in losses.items())
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    # per-task metric averaged across workers
    for t, l in losses.items():
        hvd.allreduce(l.detach(), name=f"loss_{t}")

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
