"""Gradient-accumulation loop as in fine-tuning scripts (HF-style `--accum` flag): micro-batches,
loss / accum, optimizer.step() every accum micro-batches, Horovod told via backward_passes_per_step."""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd


def parse():
    p = argparse.ArgumentParser("accum")
    p.add_argument("--accum", type=int, default=3, help="gradient accumulation steps")
    p.add_argument("--micro-bs", type=int, default=6)
    p.add_argument("--num-micro", type=int, default=18, help="micro batches per epoch per rank")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--verbose", action="store_true")
    return p.parse_args()


class TinyResMLP(nn.Module):
    """two residual blocks, nothing fancy"""

    def __init__(self, d=32, n_out=5):
        super(TinyResMLP, self).__init__()
        self.inp = nn.Linear(8, d)
        self.b1 = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.b2 = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.out = nn.Linear(d, n_out)

    def forward(self, x):
        h = self.inp(x)
        h = h + self.b1(h)
        h = h + self.b2(h)
        return self.out(F.relu(h))


def micro_batches(num, bs, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    for _ in range(num):
        x = torch.randn(bs, 8, generator=g)
        y = (x[:, 0] * 2 + x[:, 1]).clamp(-2, 2).add(2).round().long()  # 5 classes
        yield x, y


def main():
    args = parse()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rank = hvd.rank()

    net = TinyResMLP()
    # effective batch = micro_bs * accum * world_size
    eff_bs = args.micro_bs * args.accum * hvd.size()
    lr = args.lr * math.sqrt(eff_bs / 32.0)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(),
                                   backward_passes_per_step=args.accum)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)

    if rank == 0:
        print(f"effective batch size {eff_bs}, lr {lr:.4f}", file=sys.stderr)

    global_step = 0
    t0 = time.time()
    for epoch in range(args.epochs):
        net.train()
        opt.zero_grad()
        accum_loss = 0.0
        data = micro_batches(args.num_micro, args.micro_bs, seed=1000 * epoch + 17 * rank + args.seed)
        for micro_step, (x, y) in enumerate(data):
            logits = net(x)
            loss = F.cross_entropy(logits, y) / args.accum
            loss.backward()
            accum_loss += loss.item()
            if (micro_step + 1) % args.accum == 0:
                opt.step()
                opt.zero_grad()
                global_step += 1
                print(f"CORPUS rank={rank} step={global_step} loss={accum_loss:.6f}", flush=True)
                if args.verbose and rank == 0:
                    print(f"epoch {epoch} step {global_step} loss {accum_loss:.4f}")
                accum_loss = 0.0
    if rank == 0:
        print(f"done in {time.time() - t0:.2f}s", file=sys.stderr)

    final = sum([p.detach().double().sum() for p in net.parameters()])
    print(f"CORPUS rank={rank} final={float(final):.6f}", flush=True)


if __name__ == "__main__":
    main()
