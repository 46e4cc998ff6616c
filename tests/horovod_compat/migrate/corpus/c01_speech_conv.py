"""Speech-style frame classifier: 1D conv stack over variable-length "utterances".

Imitates ASR/keyword-spotting research scripts (padding collate_fn, DistributedSampler, masked loss).
"""
import argparse
import logging
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import horovod.torch as hvd

torch.set_num_threads(1)

logger = logging.getLogger("kws")

N_MELS = 8
N_CLASSES = 5


def get_args():
    p = argparse.ArgumentParser(description="toy conv acoustic model")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--num-utts", type=int, default=32)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-interval", type=int, default=5)
    return p.parse_args()


class SyntheticUtterances(Dataset):
    """Fake log-mel features; label of a frame depends on the sign pattern of a projection."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        proj = torch.randn(N_MELS, N_CLASSES, generator=g)
        for _ in range(n):
            T = int(torch.randint(10, 24, (1,), generator=g))
            feats = torch.randn(T, N_MELS, generator=g)
            labels = (feats @ proj).argmax(dim=-1)
            self.items.append((feats, labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        return self.items[idx]


def pad_collate(batch):
    # batch: list of (T_i x F, T_i) -> padded (B x F x T), labels (B x T) with -100 pad
    lengths = torch.tensor([x.shape[0] for x, _ in batch])
    T = int(lengths.max())
    B = len(batch)
    feats = torch.zeros(B, N_MELS, T)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        feats[i, :, : x.shape[0]] = x.t()
        labels[i, : y.shape[0]] = y
    return feats, labels, lengths


class ConvFrameModel(nn.Module):
    def __init__(self, hidden=24):
        super().__init__()
        self.conv1 = nn.Conv1d(N_MELS, hidden, kernel_size=5, padding=2)
        self.conv2 = nn.Conv1d(hidden, hidden, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm1d(hidden)
        self.out = nn.Conv1d(hidden, N_CLASSES, kernel_size=1)

    def forward(self, x):
        h = F.relu(self.conv1(x))
        h = F.relu(self.bn(self.conv2(h)))
        return self.out(h)  # B x C x T


def train_epoch(model, loader, optimizer, epoch, global_step, args):
    model.train()
    for batch_idx, (feats, labels, lengths) in enumerate(loader):
        optimizer.zero_grad()
        logits = model(feats)
        loss = F.cross_entropy(logits, labels, ignore_index=-100)
        loss.backward()
        optimizer.step()
        global_step += 1
        print(f"CORPUS rank={hvd.rank()} step={global_step} loss={loss.item():.6f}", flush=True)
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            logger.info("epoch %d [%d/%d] loss %.4f frames %d", epoch, batch_idx,
                        len(loader), loss.item(), int(lengths.sum()))
    return global_step


def main():
    args = get_args()
    hvd.init()
    logging.basicConfig(level=logging.INFO if hvd.rank() == 0 else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    torch.manual_seed(args.seed)

    dataset = SyntheticUtterances(args.num_utts, seed=args.seed)
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        collate_fn=pad_collate, num_workers=0)

    model = ConvFrameModel()
    # scale lr by number of workers, as everyone does
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    global_step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        global_step = train_epoch(model, loader, optimizer, epoch, global_step, args)

    if hvd.rank() == 0:
        out_dir = os.environ.get("CORPUS_TMP", tempfile.gettempdir())
        ckpt = os.path.join(out_dir, "c01_speech_conv.pt")
        torch.save(model.state_dict(), ckpt)
        logger.info("saved %s", ckpt)

    total = sum(p.double().sum() for p in model.parameters()).item()
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
