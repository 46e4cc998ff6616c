"""Imitates library code that avoids the `hvd` name (`import horovod.torch as hv`)
and reaches into `horovod.torch.mpi_ops` directly for summed counters.
"""
import logging
import os
import sys
import tempfile
from typing import Tuple

import torch
from torch import nn

import horovod.torch as hv
import horovod.torch.mpi_ops as mpi_ops

logger = logging.getLogger("trainer")

SEED = 1337
BATCH = 32
STEPS_PER_EPOCH = 6
EPOCHS = 2
NUM_CLASSES = 4


def setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(stream=sys.stderr, level=level,
                        format=f"[%(asctime)s][r{rank}] %(levelname)s %(message)s")


def synthetic_batches(rank: int, n: int, d: int = 10) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator()
    gen.manual_seed(SEED * 100 + rank)
    centers = torch.randn(NUM_CLASSES, d, generator=torch.Generator().manual_seed(SEED))
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    feats = centers[labels] + 0.7 * torch.randn(n, d, generator=gen)
    return feats, labels


class Classifier(nn.Module):
    def __init__(self, d: int = 10, width: int = 64):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(d, width), nn.Tanh(),
            nn.Linear(width, width // 2), nn.Tanh(),
        )
        self.head = nn.Linear(width // 2, NUM_CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


class Trainer:
    def __init__(self, model: nn.Module, lr: float = 0.1):
        self.model = model
        opt = torch.optim.SGD(model.parameters(), lr=lr * hv.size(), weight_decay=1e-4)
        hv.broadcast_parameters(model.state_dict(), root_rank=0)
        hv.broadcast_optimizer_state(opt, root_rank=0)
        self.optimizer = hv.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(),
            compression=hv.Compression.none)
        self.criterion = nn.CrossEntropyLoss()
        self.global_step = 0

    def count_correct(self, logits, y) -> Tuple[int, int]:
        correct = (logits.argmax(dim=1) == y).sum().to(torch.int64)
        seen = torch.tensor(y.numel(), dtype=torch.int64)
        # sum, not average, so the totals are exact across workers
        correct = mpi_ops.allreduce(correct, name="n_correct", op=mpi_ops.Sum)
        seen = mpi_ops.allreduce(seen, name="n_seen", op=mpi_ops.Sum)
        return int(correct.item()), int(seen.item())

    def fit(self, X, Y):
        for epoch in range(EPOCHS):
            tot_correct = tot_seen = 0
            for i in range(STEPS_PER_EPOCH):
                xb, yb = X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH]
                self.optimizer.zero_grad()
                logits = self.model(xb)
                loss = self.criterion(logits, yb)
                loss.backward()
                self.optimizer.step()
                self.global_step += 1
                print(f"CORPUS rank={hv.rank()} step={self.global_step} loss={loss.item():.6f}",
                      flush=True)
                c, s = self.count_correct(logits.detach(), yb)
                tot_correct += c
                tot_seen += s
            logger.info("epoch %d: global acc %.3f (%d/%d)", epoch,
                        tot_correct / max(tot_seen, 1), tot_correct, tot_seen)


def main():
    hv.init()
    torch.set_num_threads(1)
    setup_logging(hv.rank())
    torch.manual_seed(SEED)

    X, Y = synthetic_batches(hv.rank(), BATCH * STEPS_PER_EPOCH)
    model = Classifier()
    trainer = Trainer(model, lr=0.05)
    trainer.fit(X, Y)

    # persist a tiny summary from the chief only
    if hv.rank() == 0:
        path = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b02_summary.txt")
        with open(path, "w") as fh:
            fh.write(f"steps={trainer.global_step} world={hv.size()}\n")

    checksum = sum(p.double().sum() for p in model.parameters())
    print(f"CORPUS rank={hv.rank()} final={checksum.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
