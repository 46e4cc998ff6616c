"""Train + distributed evaluation as in classification research code: per-rank eval shards of
different sizes, predictions/targets collected with hvd.allgather and scored on rank 0, plus an
imagenet-example-like Metric class averaging scalars with hvd.allreduce."""
import argparse
import logging
import os
import sys

import torch
import torch.nn as nn
import horovod.torch as hvd

logger = logging.getLogger("evalgather")
NUM_CLASSES = 6


class Metric(object):
    """Running average of a scalar, averaged over all workers."""

    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.)
        self.n = torch.tensor(0.)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


def accuracy(output, target):
    pred = output.max(1, keepdim=True)[1]
    return pred.eq(target.view_as(pred)).cpu().float().mean()


class Classifier(nn.Module):
    def __init__(self, d_in=16, d_h=56):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(d_in, d_h), nn.ReLU(), nn.Linear(d_h, d_h // 2), nn.ReLU())
        self.fc = nn.Linear(d_h // 2, NUM_CLASSES)

    def forward(self, x):
        return self.fc(self.features(x))


def make_split(n, seed):
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(NUM_CLASSES, 16, generator=torch.Generator().manual_seed(99))
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    x = protos[y] + 0.9 * torch.randn(n, 16, generator=g)
    return x, y


def evaluate(model, x_val, y_val, epoch):
    model.eval()
    val_loss = Metric("val_loss")
    val_acc = Metric("val_accuracy")
    with torch.no_grad():
        out = model(x_val)
        val_loss.update(nn.functional.cross_entropy(out, y_val))
        val_acc.update(accuracy(out, y_val))
        preds = out.argmax(dim=1)
    # ranks hold different numbers of eval rows; allgather concatenates along dim 0
    all_preds = hvd.allgather(preds, name="val_preds")
    all_targets = hvd.allgather(y_val, name="val_targets")
    if hvd.rank() == 0:
        exact = (all_preds == all_targets).float().mean().item()
        per_class = torch.bincount(all_targets[all_preds == all_targets], minlength=NUM_CLASSES)
        logger.info("epoch %d: %d eval rows, exact acc %.4f, mean-of-rank acc %.4f, loss %.4f, "
                    "correct/class %s", epoch, all_targets.numel(), exact, val_acc.avg.item(),
                    val_loss.avg.item(), per_class.tolist())
    return val_loss.avg.item()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--train-rows", type=int, default=48)
    parser.add_argument("--bs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)

    hvd.init()
    torch.set_num_threads(1)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO if hvd.rank() == 0 else logging.WARN)
    torch.manual_seed(args.seed)

    x_tr, y_tr = make_split(args.train_rows, seed=args.seed * 100 + hvd.rank())
    n_eval = 5 + 2 * hvd.rank()  # 5 rows on rank 0, 7 on rank 1, ...
    x_val, y_val = make_split(n_eval, seed=args.seed * 100 + 50 + hvd.rank())

    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.8)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # same averaged val loss on every rank -> every rank's plateau scheduler agrees
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        train_loss = Metric("train_loss")
        for i in range(0, args.train_rows, args.bs):
            xb, yb = x_tr[i:i + args.bs], y_tr[i:i + args.bs]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            step += 1
            train_loss.update(loss)
            print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), step, loss.item()), flush=True)
        vl = evaluate(model, x_val, y_val, epoch)
        plateau.step(vl)
        if hvd.rank() == 0:
            logger.info("epoch %d train loss %.4f lr %.4f", epoch, train_loss.avg.item(),
                        optimizer.param_groups[0]["lr"])

    final = torch.zeros(1, dtype=torch.float64)
    for p in model.parameters():
        final += p.double().sum()
    print("CORPUS rank=%d final=%.6f" % (hvd.rank(), final.item()), flush=True)


if __name__ == "__main__":
    main()
