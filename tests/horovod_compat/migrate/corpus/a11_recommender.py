"""Recommender-system training script in the NCF / two-tower style (user and item embedding
tables + MLP, implicit feedback with BCE and negative sampling), Adam + Horovod op=hvd.Average."""
import argparse
import logging
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import horovod.torch as hvd

LOG = logging.getLogger("ncf")

NUM_USERS = 40
NUM_ITEMS = 60


def parse_args():
    parser = argparse.ArgumentParser(description="NCF with horovod")
    parser.add_argument("--factors", type=int, default=16)
    parser.add_argument("--layers", type=str, default="32,16", help="comma separated MLP sizes")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--neg-ratio", type=int, default=2)
    parser.add_argument("--interactions-per-rank", type=int, default=64)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--save", action="store_true", help="save the embeddings at the end")
    return parser.parse_args()


class NeuMF(nn.Module):
    def __init__(self, n_users, n_items, factors=16, layers=(32, 16)):
        super(NeuMF, self).__init__()
        self.user_emb = nn.Embedding(n_users, factors)
        self.item_emb = nn.Embedding(n_items, factors)
        mlp, d = [], 2 * factors
        for h in layers:
            mlp += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.mlp = nn.Sequential(*mlp)
        self.predict = nn.Linear(d + factors, 1)
        nn.init.normal_(self.user_emb.weight, std=0.1)
        nn.init.normal_(self.item_emb.weight, std=0.1)

    def forward(self, users, items):
        u, i = self.user_emb(users), self.item_emb(items)
        gmf = u * i
        h = self.mlp(torch.cat([u, i], dim=-1))
        return self.predict(torch.cat([gmf, h], dim=-1)).squeeze(-1)


def load_interactions(rank, n, seed):
    """fake implicit-feedback log: users like items whose id is congruent to theirs mod 4"""
    rs = np.random.RandomState(seed + rank)
    users = rs.randint(0, NUM_USERS, size=n)
    items = (users * 3 + 4 * rs.randint(0, NUM_ITEMS // 4, size=n)) % NUM_ITEMS
    return users.astype(np.int64), items.astype(np.int64)


def with_negatives(users, items, neg_ratio, rs):
    neg_u = np.repeat(users, neg_ratio)
    neg_i = rs.randint(0, NUM_ITEMS, size=neg_u.shape[0])
    u = np.concatenate([users, neg_u])
    i = np.concatenate([items, neg_i])
    y = np.concatenate([np.ones(len(users)), np.zeros(len(neg_u))]).astype(np.float32)
    perm = rs.permutation(len(u))
    return torch.from_numpy(u[perm]), torch.from_numpy(i[perm]), torch.from_numpy(y[perm])


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    logging.basicConfig(level=logging.INFO if hvd.rank() == 0 else logging.WARNING)

    model = NeuMF(NUM_USERS, NUM_ITEMS, args.factors, [int(x) for x in args.layers.split(",")])
    n_params = sum(p.numel() for p in model.parameters())
    LOG.info("NeuMF with %d parameters, %d workers", n_params, hvd.size())

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    criterion = nn.BCEWithLogitsLoss()

    users, items = load_interactions(hvd.rank(), args.interactions_per_rank, args.seed)
    step = 0
    for epoch in range(args.epochs):
        tic = time.time()
        rs = np.random.RandomState(args.seed * 7 + epoch * 13 + hvd.rank())
        u, i, y = with_negatives(users, items, args.neg_ratio, rs)
        model.train()
        for b in range(0, len(y), args.batch_size):
            ub, ib, yb = u[b:b + args.batch_size], i[b:b + args.batch_size], y[b:b + args.batch_size]
            optimizer.zero_grad()
            logits = model(ub, ib)
            loss = criterion(logits, yb)
            loss.backward()
            optimizer.step()
            step += 1
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        LOG.info("epoch %d took %.2fs", epoch, time.time() - tic)

    if args.save and hvd.rank() == 0:
        out = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "a11_embeddings.pt")
        torch.save({"user": model.user_emb.weight.detach(), "item": model.item_emb.weight.detach()}, out)

    final = sum(p.double().sum() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={final.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
