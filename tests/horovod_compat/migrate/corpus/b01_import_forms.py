"""Mixed import forms, the way older research repos grew them: the helpers are
from-imported and used bare, while `hvd` is still imported for rank/size/init.
"""
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd
from horovod.torch import DistributedOptimizer, broadcast_parameters, allreduce

torch.set_num_threads(1)


def get_args():
    p = argparse.ArgumentParser(description="tiny regression w/ horovod")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log-interval", type=int, default=4)
    return p.parse_args()


class Net(nn.Module):
    def __init__(self, d_in=12, hidden=48):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.out(x).squeeze(-1)


def make_data(seed, n=128, d=12):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    w = torch.linspace(-1.0, 1.0, d)
    y = X @ w + 0.1 * torch.randn(n, generator=g)
    return X, y


def metric_average(val, name):
    # classic pytorch_mnist.py helper, but with the bare allreduce import
    tensor = torch.tensor(val)
    avg_tensor = allreduce(tensor, name=name)
    return avg_tensor.item()


def main():
    args = get_args()
    hvd.init()
    torch.manual_seed(args.seed)

    # each worker gets its own shard
    X, y = make_data(args.seed + hvd.rank())

    model = Net()
    # scale lr by number of workers (linear scaling rule)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)

    broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    step = 0
    n_batches = X.shape[0] // args.batch_size
    for epoch in range(1, args.epochs + 1):
        model.train()
        running = 0.0
        for b in range(n_batches):
            xb = X[b * args.batch_size:(b + 1) * args.batch_size]
            yb = y[b * args.batch_size:(b + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            step += 1
            running += loss.item()
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
            if b % args.log_interval == 0 and hvd.rank() == 0:
                print("Train Epoch: {} [{}/{}]\tLoss: {:.4f}".format(
                    epoch, b * args.batch_size, X.shape[0], loss.item()))

        epoch_loss = metric_average(running / n_batches, "avg_loss")
        if hvd.rank() == 0:
            print("epoch {} avg loss over workers: {:.4f}".format(epoch, epoch_loss), flush=True)

    if hvd.rank() == 0:
        out_dir = os.environ.get("CORPUS_TMP", tempfile.gettempdir())
        ckpt = os.path.join(out_dir, "b01_checkpoint.pt")
        torch.save({"model": model.state_dict(), "epochs": args.epochs}, ckpt)
        print("saved", ckpt)

    total = sum(p.double().sum() for p in model.parameters()).item()
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
