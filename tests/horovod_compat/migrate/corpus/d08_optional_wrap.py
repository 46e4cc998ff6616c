"""'Works with or without Horovod' script: the optimizer is only wrapped when more than
one worker is running, and the (maybe wrapped) optimizer is handed to train()."""
import argparse
import sys

import torch
import torch.nn as nn
import horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--lr", default=0.05, type=float)
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--steps-per-epoch", default=6, type=int)
parser.add_argument("--batch-size", default=24, type=int)
parser.add_argument("--seed", default=5, type=int)
args = parser.parse_args()


def log(*a):
    if hvd.rank() == 0:
        print("[train]", *a, file=sys.stdout, flush=True)


def get_model():
    return nn.Sequential(
        nn.Linear(8, 40), nn.ELU(),
        nn.Linear(40, 40), nn.ELU(),
        nn.Linear(40, 1),
    )


def batches(epoch, rank, n, bs):
    g = torch.Generator()
    g.manual_seed(args.seed * 1_000_003 + epoch * 101 + rank)
    for _ in range(n):
        x = torch.rand(bs, 8, generator=g) * 2 - 1
        y = torch.sin(3 * x[:, :1]) * x[:, 1:2] + 0.5 * x[:, 2:3] ** 2 - x[:, 3:4]
        yield x, y


def train(model, optimizer, loss_fn, epochs, start_step=0):
    step = start_step
    for epoch in range(epochs):
        model.train()
        ep_loss = 0.
        for x, y in batches(epoch, hvd.rank(), args.steps_per_epoch, args.batch_size):
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
            ep_loss += loss.item()
            step += 1
        log(f"epoch {epoch} mean loss {ep_loss / args.steps_per_epoch:.5f}")
    return step


if __name__ == "__main__":
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(args.seed)

    model = get_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.8)
    if hvd.size() > 1:
        log(f"running distributed on {hvd.size()} workers")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), op=hvd.Average
        )
    else:
        log("single process run")

    n = train(model, optimizer, nn.SmoothL1Loss(beta=0.5), args.epochs)
    log(f"finished {n} steps")
    final = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)
