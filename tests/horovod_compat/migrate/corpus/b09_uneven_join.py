"""Uneven shards handled with `hvd.join()`, as in recommender/NLP jobs where files
are split per worker and counts don't match: each rank trains on what it has,
then joins; the weights are re-synced from rank 0 afterwards.
"""
import argparse
import logging
import os
import tempfile

import torch
import torch.nn as nn
import horovod.torch as hvd

logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
logger = logging.getLogger("uneven")


def load_shard(rank: int, batch_size: int):
    """Pretend to read this worker's part files; rank 1 got fewer rows."""
    n_batches = 9 if rank == 0 else 6
    g = torch.Generator().manual_seed(77 + 1000 * rank)
    users = torch.randint(0, 50, (n_batches * batch_size,), generator=g)
    items = torch.randint(0, 40, (n_batches * batch_size,), generator=g)
    # implicit "rating": deterministic function of ids plus noise
    rating = ((users % 5).float() - (items % 4).float()) / 2.0 + 0.1 * torch.randn(len(users), generator=g)
    return list(zip(users.split(batch_size), items.split(batch_size), rating.split(batch_size)))


class MF(nn.Module):
    def __init__(self, n_users=50, n_items=40, dim=16):
        super().__init__()
        self.u = nn.Embedding(n_users, dim)
        self.i = nn.Embedding(n_items, dim)
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.u.weight, std=0.1)
        nn.init.normal_(self.i.weight, std=0.1)

    def forward(self, u, i):
        return (self.u(u) * self.i(i)).sum(-1) + self.bias


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(12)

    shard = load_shard(hvd.rank(), args.batch_size)
    logger.info("rank %d has %d batches", hvd.rank(), len(shard))

    model = MF()
    opt = torch.optim.Adagrad(model.parameters(), lr=args.lr)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = nn.MSELoss()

    step = 0
    for users, items, r in shard:
        opt.zero_grad()
        pred = model(users, items)
        loss = loss_fn(pred, r)
        loss.backward()
        opt.step()
        step += 1
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    # ranks that ran out of data wait here; their gradients count as zeros meanwhile
    last = hvd.join()
    logger.info("rank %d joined (last to join: %d)", hvd.rank(), last)

    # the ranks drifted apart while some were joined, bring them back in line
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    if hvd.rank() == 0:
        torch.save(model.state_dict(), os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b09_mf.pt"))

    total = 0.0
    for name, p in model.named_parameters():
        total += p.double().sum().item()
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
