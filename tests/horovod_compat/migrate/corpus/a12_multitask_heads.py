"""Multi-task learning script (shared encoder + task heads) in the style of MTL research code:
the auxiliary head is only trained on even steps, so its parameters get no gradient on odd steps.
SGD with momentum, optimizer state broadcast from rank 0."""
import argparse
import logging
from collections import OrderedDict
from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

logger = logging.getLogger("mtl")


class SharedEncoder(nn.Module):
    def __init__(self, d_in: int, d_hid: int):
        super().__init__()
        self.net = nn.Sequential(OrderedDict([
            ("fc1", nn.Linear(d_in, d_hid)),
            ("act1", nn.ReLU()),
            ("fc2", nn.Linear(d_hid, d_hid)),
            ("act2", nn.ReLU()),
        ]))

    def forward(self, x):
        return self.net(x)


class MultiTaskNet(nn.Module):
    def __init__(self, d_in=12, d_hid=48, n_classes=4):
        super().__init__()
        self.encoder = SharedEncoder(d_in, d_hid)
        self.heads = nn.ModuleDict({
            "cls": nn.Linear(d_hid, n_classes),  # main task
            "reg": nn.Sequential(nn.Linear(d_hid, 16), nn.Tanh(), nn.Linear(16, 1)),  # auxiliary task
        })

    def forward(self, x, tasks=("cls", "reg")) -> Dict[str, torch.Tensor]:
        z = self.encoder(x)
        return {t: self.heads[t](z) for t in tasks}


def synth_batch(gen, bs):
    x = torch.randn(bs, 12, generator=gen)
    y_cls = (x[:, :4].abs().argmax(dim=1))
    y_reg = (x[:, 4:8].sum(dim=1, keepdim=True) * 0.5).tanh()
    return x, y_cls, y_reg


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--bs", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--aux-weight", type=float, default=0.5)
    p.add_argument("--aux-every", type=int, default=2, help="train aux head every N steps")
    p.add_argument("--seed", type=int, default=8)
    return p.parse_args()


def main():
    args = get_args()
    hvd.init()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"[r{hvd.rank()}] %(message)s")
    torch.manual_seed(args.seed)

    model = MultiTaskNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    gen = torch.Generator()
    gen.manual_seed(args.seed + 1000 * hvd.rank())
    for step in range(1, args.steps + 1):
        model.train()
        x, y_cls, y_reg = synth_batch(gen, args.bs)
        use_aux = (step % args.aux_every == 0)
        tasks = ("cls", "reg") if use_aux else ("cls",)
        out = model(x, tasks=tasks)
        loss = F.cross_entropy(out["cls"], y_cls)
        if use_aux:
            loss = loss + args.aux_weight * F.mse_loss(out["reg"], y_reg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        if hvd.rank() == 0 and step % 4 == 0:
            logger.info("step %d loss %.4f (aux=%s)", step, loss.item(), use_aux)

    total = torch.tensor(0.0, dtype=torch.float64)
    for name, p in model.named_parameters():
        total += p.double().sum()
    print(f"CORPUS rank={hvd.rank()} final={total.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
