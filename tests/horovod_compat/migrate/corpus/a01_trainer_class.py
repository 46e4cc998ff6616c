"""Trainer-class style, as in many research repos (model/optimizer/scheduler held on self,
a fit() method, metrics averaged across workers with hvd.allreduce)."""
import argparse
import logging
import os
import time
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

logger = logging.getLogger("trainer")


class SmallNet(nn.Module):
    def __init__(self, in_dim: int = 16, hidden: int = 64, n_cls: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden // 2)
        self.head = nn.Linear(hidden // 2, n_cls)
        self.drop = nn.Dropout(0.0)  # kept for parity with the "real" config

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = self.drop(F.relu(self.fc2(x)))
        return self.head(x)


def make_data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(1234))
    y = (x @ w).argmax(dim=1)
    return x, y


class AverageMeter:
    def __init__(self):
        self.reset()

    def reset(self):
        self.sum = 0.0
        self.n = 0

    def update(self, v: float, k: int = 1):
        self.sum += v * k
        self.n += k

    @property
    def avg(self):
        return self.sum / max(self.n, 1)


class Trainer:
    def __init__(self, model: nn.Module, args: argparse.Namespace, device: str = "cpu"):
        self.args = args
        self.device = device
        self.model = model.to(device)
        # scale lr by the number of workers (linear scaling rule)
        base_opt = torch.optim.SGD(self.model.parameters(), lr=args.lr * hvd.size(),
                                   momentum=0.9, weight_decay=args.wd)
        self.optimizer = hvd.DistributedOptimizer(base_opt,
                                                  named_parameters=self.model.named_parameters())
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=args.lr_step,
                                                         gamma=0.5)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        self.global_step = 0
        self.history: Dict[str, list] = {"loss": [], "acc": []}

    def _metric_avg(self, val: float, name: str) -> float:
        t = torch.tensor(val)
        avg = hvd.allreduce(t, name=name)
        return avg.item()

    def _batches(self, x, y):
        bs = self.args.batch_size
        for i in range(0, x.shape[0], bs):
            yield x[i:i + bs], y[i:i + bs]

    def train_epoch(self, epoch: int, x, y):
        self.model.train()
        loss_m, acc_m = AverageMeter(), AverageMeter()
        for bx, by in self._batches(x, y):
            bx, by = bx.to(self.device), by.to(self.device)
            self.optimizer.zero_grad()
            out = self.model(bx)
            loss = F.cross_entropy(out, by)
            loss.backward()
            self.optimizer.step()
            self.global_step += 1
            print(f"CORPUS rank={hvd.rank()} step={self.global_step} loss={loss.item():.6f}",
                  flush=True)
            loss_m.update(loss.item(), bx.shape[0])
            acc_m.update((out.argmax(1) == by).float().mean().item(), bx.shape[0])
        self.scheduler.step()
        return loss_m.avg, acc_m.avg

    def fit(self, x, y, epochs: Optional[int] = None):
        epochs = epochs or self.args.epochs
        for epoch in range(epochs):
            t0 = time.time()
            tr_loss, tr_acc = self.train_epoch(epoch, x, y)
            tr_loss = self._metric_avg(tr_loss, "avg_loss")
            tr_acc = self._metric_avg(tr_acc, "avg_acc")
            self.history["loss"].append(tr_loss)
            self.history["acc"].append(tr_acc)
            if hvd.rank() == 0:
                logger.info("epoch %d loss %.4f acc %.3f lr %.4f (%.2fs)", epoch, tr_loss, tr_acc,
                            self.scheduler.get_last_lr()[0], time.time() - t0)
        return self.history


def parse_args():
    p = argparse.ArgumentParser(description="trainer-class horovod example")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--lr-step", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--n-train", type=int, default=128)
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    logging.basicConfig(level=logging.INFO if hvd.rank() == 0 else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    torch.manual_seed(args.seed)
    model = SmallNet()
    x, y = make_data(args.n_train, seed=args.seed + hvd.rank())
    trainer = Trainer(model, args)
    trainer.fit(x, y)
    total = sum(p.double().sum() for p in trainer.model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
