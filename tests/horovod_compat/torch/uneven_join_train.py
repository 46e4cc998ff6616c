"""A Horovod training script with uneven data, as a new user writes it: run under `horovodrun -np N`.

Rank r holds BATCHES - r batches (rank 1 has one batch fewer than rank 0), so the ranks that run
out first call `hvd.join()` -- Horovod's documented answer to uneven data -- while the others
finish their epoch: joined ranks contribute zero gradients and the DistributedOptimizer still
averages over the full size. After each epoch the parameters are re-synchronised from the rank
`join()` returned (the last to join). Every rank also replays the whole run locally (all ranks'
batches, zeros for joined ranks) and prints both results on one line:

    JOIN RESULT rank=0 last_joined=[0, 0] weights=[...] expected=[...] losses=[...]
"""
from __future__ import annotations

import json

import torch

import horovod.torch as hvd

BATCHES = 4
EPOCHS = 2
LR = 0.1


def batch(rank: int, epoch: int, i: int):
    g = torch.Generator().manual_seed(1000 * rank + 100 * epoch + i)
    x = torch.randn(8, 6, generator=g)
    return x, x @ torch.arange(1.0, 7.0).unsqueeze(1) + 0.5  # a learnable linear target


def make_model() -> torch.nn.Module:
    torch.manual_seed(42)
    return torch.nn.Linear(6, 1)


def flat(model: torch.nn.Module) -> list:
    return [round(v, 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()]


def expected_weights(size: int) -> list:
    """The run replayed in one process: step t averages the gradients of ranks that still have data."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for epoch in range(EPOCHS):
        for i in range(BATCHES):
            opt.zero_grad()
            for r in range(size):
                if i < BATCHES - r:
                    torch.nn.functional.mse_loss(model(batch(r, epoch, i)[0]), batch(r, epoch, i)[1]).backward()
            for p in model.parameters():
                p.grad /= size
            opt.step()
    return flat(model)


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    losses, last_joined = [], []
    for epoch in range(EPOCHS):
        for i in range(BATCHES - rank):  # uneven: rank r has r batches fewer
            x, y = batch(rank, epoch, i)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(round(loss.item(), 6))
        last = hvd.join()
        last_joined.append(last)
        hvd.broadcast_parameters(model.state_dict(), root_rank=last)
        hvd.broadcast_optimizer_state(optimizer, root_rank=last)
    print("JOIN RESULT " + json.dumps({"rank": rank, "size": size, "last_joined": last_joined,
                                       "weights": flat(model), "expected": expected_weights(size),
                                       "losses": losses}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
