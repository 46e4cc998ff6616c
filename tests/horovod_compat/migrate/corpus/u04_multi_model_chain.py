"""Style: encoder + head as two separate modules under one optimizer; named
parameters from both combined with itertools.chain, plus param groups."""
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

hvd.init()
torch.manual_seed(1234)

encoder = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 8))
head = nn.Linear(8, 2)

optimizer = torch.optim.SGD(
    [
        {"params": encoder.parameters(), "lr": 0.05},
        {"params": head.parameters(), "lr": 0.1},
    ],
    momentum=0.5,
)
named = itertools.chain(
    (("encoder." + n, p) for n, p in encoder.named_parameters()),
    (("head." + n, p) for n, p in head.named_parameters()),
)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=named)

hvd.broadcast_parameters(encoder.state_dict(), root_rank=0)
hvd.broadcast_parameters(head.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

g = torch.Generator()
g.manual_seed(77 + hvd.rank())
X = torch.randn(64, 10, generator=g)
Y = (X[:, 0] > X[:, 1]).long()

step = 0
for epoch in range(2):
    for i in range(0, 64, 16):
        xb, yb = X[i:i + 16], Y[i:i + 16]
        optimizer.zero_grad()
        logits = head(encoder(xb))
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        optimizer.step()
        step += 1
        print("CORPUS rank=%d step=%d loss=%s" % (hvd.rank(), step, f"{loss.item():.6f}"),
              flush=True)

final = 0.0
for p in itertools.chain(encoder.parameters(), head.parameters()):
    if p.requires_grad:
        final += p.detach().sum().item()
print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)
