"""Regression with early stopping: global val loss via hvd.allreduce, rank 0 decides, flag broadcast.

Imitates applied-ML training loops (e.g. tabular/energy forecasting) with a hand-rolled EarlyStopper.
"""
import argparse
import logging
import os
import sys
import tempfile

import torch
import torch.nn as nn

import horovod.torch as hvd

LOG = logging.getLogger("trainer")


class EarlyStopper:
    def __init__(self, patience=2, min_delta=0.0):
        self.patience = patience
        self.min_delta = min_delta
        self.best = float("inf")
        self.bad_epochs = 0

    def update(self, val_loss):
        """Returns True when training should stop."""
        if val_loss < self.best - self.min_delta:
            self.best = val_loss
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs > self.patience


def build_data(rank, n_train=48, n_val=32, d=6):
    g = torch.Generator().manual_seed(555)
    w_true = torch.randn(d, 1, generator=g)
    g.manual_seed(555 + 10 * (rank + 1))
    Xtr = torch.randn(n_train, d, generator=g)
    # heavy label noise on a small train set -> the model overfits quickly
    ytr = Xtr @ w_true + 1.5 * torch.randn(n_train, 1, generator=g)
    Xva = torch.randn(n_val, d, generator=g)
    yva = Xva @ w_true + 0.1 * torch.randn(n_val, 1, generator=g)
    return (Xtr, ytr), (Xva, yva)


def evaluate(model, X, y):
    model.eval()
    with torch.no_grad():
        loss = nn.functional.mse_loss(model(X), y)
    # average across workers
    return hvd.allreduce(loss, name="val_loss").item()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--patience", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    hvd.init()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO if hvd.rank() == 0 else logging.ERROR,
                        format="%(levelname)s %(message)s")

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    (Xtr, ytr), (Xva, yva) = build_data(hvd.rank())
    stopper = EarlyStopper(patience=args.patience)
    ckpt_path = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "c08_best.pt")

    global_step = 0
    for epoch in range(args.max_epochs):
        model.train()
        perm = torch.randperm(len(Xtr), generator=torch.Generator().manual_seed(epoch))
        for b in range(0, len(Xtr), args.batch_size):
            idx = perm[b:b + args.batch_size]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(Xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            global_step += 1
            print(f"CORPUS rank={hvd.rank()} step={global_step} loss={loss.item():.6f}", flush=True)

        val = evaluate(model, Xva, yva)
        LOG.info("epoch %d val_loss %.5f (best %.5f)", epoch, val, stopper.best)

        should_stop = False
        if hvd.rank() == 0:
            improved = val < stopper.best
            should_stop = stopper.update(val)
            if improved:
                torch.save(model.state_dict(), ckpt_path)
        stop_flag = hvd.broadcast(torch.tensor(int(should_stop)), root_rank=0, name="stop_flag")
        if stop_flag.item():
            LOG.info("early stopping at epoch %d", epoch)
            break

    hvd.barrier()
    final = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
