"""Style: gradient clipping the Horovod way -- optimizer.synchronize(),
clip_grad_norm_, then `with optimizer.skip_synchronize(): optimizer.step()`."""
import torch
import torch.nn as nn
from torch.nn.utils import clip_grad_norm_

import horovod.torch as hvd

MAX_NORM = 0.5


def main():
    hvd.init()
    torch.manual_seed(2024)

    model = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(),
                          nn.Linear(24, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(33 + hvd.rank())
    data = torch.randn(80, 6, generator=gen)
    target = (data ** 2).mean(dim=1, keepdim=True)

    for step in range(1, 11):
        idx = slice((step - 1) * 8, step * 8)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(data[idx]), target[idx])
        loss.backward()
        optimizer.synchronize()
        clip_grad_norm_(model.parameters(), MAX_NORM)
        with optimizer.skip_synchronize():
            optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    final = sum(p.detach().sum().item() for p in model.parameters() if p.requires_grad)
    print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)


main()
