"""Click-through-rate model (embeddings + MLP) in the style of recsys notebooks turned into scripts:
the model variable is re-bound several times and the device string is built from hvd.local_rank().
"""
import argparse
import os
import random
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn

import horovod.torch as hvd


class Net(nn.Module):
    """Tiny DLRM-ish: sparse embeddings + dense features -> MLP -> logit."""

    def __init__(self, n_users=50, n_items=40, emb_dim=8, n_dense=4):
        super(Net, self).__init__()
        self.user_emb = nn.Embedding(n_users, emb_dim)
        self.item_emb = nn.Embedding(n_items, emb_dim)
        self.dense = nn.Linear(n_dense, emb_dim)
        self.top = nn.Sequential(nn.Linear(3 * emb_dim + 1, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, u, i, xd):
        eu, ei, ed = self.user_emb(u), self.item_emb(i), self.dense(xd)
        dot = (eu * ei).sum(-1, keepdim=True)
        z = torch.cat([eu, ei, ed, dot], dim=-1)
        return self.top(z).squeeze(-1)


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fake_clicks(n, rng):
    u = rng.integers(0, 50, size=n)
    i = rng.integers(0, 40, size=n)
    xd = rng.normal(size=(n, 4)).astype(np.float64)  # float64 on purpose, cast later
    logit = 0.8 * np.sin(u * 0.3) * np.cos(i * 0.2) + 0.5 * xd[:, 0] - 0.3 * xd[:, 2]
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return u, i, xd, y


parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true", default=False)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
seed_everything(31337)

use_cuda = args.cuda and torch.cuda.is_available()
device = "cuda:{}".format(hvd.local_rank()) if use_cuda else "cpu"
if use_cuda:
    torch.cuda.set_device(hvd.local_rank())

model = Net()
model = model.float()
model = model.to(device)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
loss_fn = nn.BCEWithLogitsLoss()

rng = np.random.default_rng(7 + hvd.rank())
U, I, XD, Y = fake_clicks(args.steps * args.batch, rng)

tic = time.time()
for step in range(args.steps):
    s = slice(step * args.batch, (step + 1) * args.batch)
    u = torch.from_numpy(U[s]).long().to(device)
    i = torch.from_numpy(I[s]).long().to(device)
    xd = torch.from_numpy(XD[s]).float().to(device)
    y = torch.from_numpy(Y[s]).to(device)

    optimizer.zero_grad()
    logits = model(u, i, xd)
    loss = loss_fn(logits, y)
    loss.backward()
    optimizer.step()
    print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), step + 1, loss.item()), flush=True)

if hvd.rank() == 0:
    print("train time %.2fs on %s" % (time.time() - tic, device))
    model = model.cpu()
    torch.save(model.state_dict(),
               os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "c07_ctr.pt"))

with torch.no_grad():
    final = sum(p.double().sum() for p in model.parameters())
print("CORPUS rank=%d final=%.6f" % (hvd.rank(), final), flush=True)
