"""Classification script with a small hand-rolled `metrics` section, like the utils.py
found in many Horovod training repos (allreduce-averaged scalars, summed correct/total)."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd


# ----------------------------------------------------------------------------- metrics
def average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def global_accuracy(correct, total, name="acc"):
    counts = torch.tensor([correct, total], dtype=torch.float64)
    counts = hvd.allreduce(counts, op=hvd.Sum, name=name + ".counts")
    return (counts[0] / counts[1]).item()


class AverageMeter(object):
    """Computes and stores the average and current value"""

    def __init__(self, name):
        self.name = name
        self.reset()

    def reset(self):
        self.val = 0.
        self.sum = 0.
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)

    def synced_avg(self):
        return average(self.avg, "meter." + self.name)


# ----------------------------------------------------------------------------- model/data
class ConvText(nn.Module):
    """1d-conv bag-of-ngrams classifier over a tiny vocabulary."""

    def __init__(self, vocab=30, emb=12, ch=16, n_cls=3):
        super(ConvText, self).__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.conv = nn.Conv1d(emb, ch, kernel_size=3, padding=1)
        self.fc = nn.Linear(ch, n_cls)

    def forward(self, tokens):
        h = self.emb(tokens).transpose(1, 2)
        h = F.relu(self.conv(h)).max(dim=2).values
        return self.fc(h)


def make_split(gen, n, seq=10, vocab=30):
    toks = torch.randint(0, vocab, (n, seq), generator=gen)
    # label = which third of the vocab dominates
    buckets = (toks * 3) // vocab
    counts = torch.stack([(buckets == k).sum(1) for k in range(3)], 1)
    return toks, counts.argmax(1)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--bs", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.01)
    return p.parse_args()


def main():
    args = parse()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)

    g = torch.Generator().manual_seed(1000 + hvd.rank())
    x_tr, y_tr = make_split(g, 80)
    x_va, y_va = make_split(g, 30 + 10 * hvd.rank())   # uneven val shards on purpose

    model = ConvText()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    step = 0
    for epoch in range(args.epochs):
        t0 = time.time()
        model.train()
        loss_meter = AverageMeter("train_loss")
        for i in range(0, x_tr.size(0), args.bs):
            xb, yb = x_tr[i:i + args.bs], y_tr[i:i + args.bs]
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            loss_meter.update(loss.item(), xb.size(0))
            print("CORPUS rank=%d step=%d loss=%.6f" % (hvd.rank(), step, loss.item()), flush=True)
            step += 1

        model.eval()
        with torch.no_grad():
            pred = model(x_va).argmax(1)
            correct = int((pred == y_va).sum())
        acc = global_accuracy(correct, len(y_va), name="val_acc.%d" % epoch)
        train_loss = loss_meter.synced_avg()
        epoch_time = average(time.time() - t0, "epoch_time")
        if hvd.rank() == 0:
            print("epoch %d train_loss %.4f val_acc %.4f (%.2fs)" % (epoch, train_loss, acc, epoch_time),
                  flush=True)

    total = 0.0
    for _, p in sorted(model.state_dict().items()):
        total += p.double().sum().item()
    print("CORPUS rank=%d final=%.6f" % (hvd.rank(), total), flush=True)


if __name__ == "__main__":
    main()
