"""Elastic Horovod job in the style of the pytorch_synthetic/elastic examples:
`@hvd.elastic.run` over a `TorchState`, periodic `state.commit()`, reset callbacks.
Meant to be launched with `horovodrun --min-np/--max-np`, but also runs fixed-size.
"""
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

parser = argparse.ArgumentParser(description="elastic toy")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches-per-epoch", type=int, default=7)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--base-lr", type=float, default=0.02)
parser.add_argument("--batches-per-commit", type=int, default=3)
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(4321)


class TinyResBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.l1 = nn.Linear(d, d)
        self.l2 = nn.Linear(d, d)

    def forward(self, x):
        return x + self.l2(F.gelu(self.l1(x)))


model = nn.Sequential(nn.Linear(10, 32), TinyResBlock(32), TinyResBlock(32), nn.Linear(32, 2))

lr_scaler = hvd.size()
optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * lr_scaler, momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def get_batch(epoch, batch_idx, rank):
    # deterministic per (epoch, batch, rank): survives restarts with the same data
    g = torch.Generator().manual_seed(10_000 * epoch + 100 * batch_idx + rank)
    x = torch.randn(args.batch_size, 10, generator=g)
    y = (x[:, :5].sum(1) > x[:, 5:].sum(1)).long()
    return x, y


@hvd.elastic.run
def train(state):
    # resume from wherever the last commit left off
    for state.epoch in range(state.epoch, args.epochs):
        for state.batch in range(state.batch, args.batches_per_epoch):
            data, target = get_batch(state.epoch, state.batch, hvd.rank())
            optimizer.zero_grad()
            output = model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()

            gstep = state.epoch * args.batches_per_epoch + state.batch + 1
            print(f"CORPUS rank={hvd.rank()} step={gstep} loss={loss.item():.6f}", flush=True)

            if state.batch % args.batches_per_commit == 0:
                state.commit()
        # new epoch starts at batch 0
        state.batch = 0
        if hvd.rank() == 0:
            print(f"finished epoch {state.epoch}", flush=True)
    return state.epoch


def on_state_reset():
    # adjust learning rate to the new world size after a reset
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.base_lr * hvd.size()
    if hvd.rank() == 0:
        print(f"state reset, new size {hvd.size()}", flush=True)


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)

if hvd.rank() == 0:
    torch.save(model.state_dict(),
               os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b07_elastic.pt"))

param_sum = sum(p.double().sum() for p in model.parameters()).item()
print(f"CORPUS rank={hvd.rank()} final={param_sum:.6f}", flush=True)
