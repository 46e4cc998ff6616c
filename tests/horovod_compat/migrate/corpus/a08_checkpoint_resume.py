"""Checkpoint / resume pattern from long-running cluster jobs: rank 0 writes model+optimizer each
epoch, on start rank 0 loads the latest checkpoint and broadcasts epoch, weights and optimizer state.
The script simulates a preemption: train 2 epochs, then "restart" from the checkpoint for 1 more."""
import argparse
import glob
import logging
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

logger = logging.getLogger(__name__)

CKPT_DIR = os.environ.get("CORPUS_TMP") or tempfile.gettempdir()
CKPT_FORMAT = "a08_checkpoint-{epoch}.pth.tar"
STEPS_PER_EPOCH = 5


def args_parser():
    parser = argparse.ArgumentParser(description="resume-able training")
    parser.add_argument("--checkpoint-dir", default=CKPT_DIR)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--stop-after", type=int, default=2,
                        help="simulate preemption after this many epochs (0 = never)")
    parser.add_argument("--base-lr", type=float, default=0.02)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=3)
    return parser


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(10, 64)
        self.l2 = nn.Linear(64, 32)
        self.l3 = nn.Linear(32, 3)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def checkpoint_path(args, epoch):
    return os.path.join(args.checkpoint_dir, CKPT_FORMAT.format(epoch=epoch))


def latest_checkpoint_epoch(args):
    files = glob.glob(os.path.join(args.checkpoint_dir, CKPT_FORMAT.format(epoch="*")))
    epochs = [int(f.rsplit("-", 1)[1].split(".")[0]) for f in files]
    return max(epochs) if epochs else 0


def save_checkpoint(args, model, optimizer, epoch):
    if hvd.rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save(state, checkpoint_path(args, epoch))


def build(args):
    torch.manual_seed(args.seed)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    return model, optimizer


def restore(args, model, optimizer):
    resume_from_epoch = 0
    if hvd.rank() == 0:
        resume_from_epoch = latest_checkpoint_epoch(args)
        if resume_from_epoch > 0:
            ckpt = torch.load(checkpoint_path(args, resume_from_epoch))
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            logger.info("resumed from epoch %d", ckpt["epoch"])
    # Horovod: broadcast resume_from_epoch from rank 0 (which will have
    # checkpoints) to other ranks.
    resume_from_epoch = hvd.broadcast_object(resume_from_epoch, root_rank=0, name="resume")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return resume_from_epoch


def batches_for_epoch(epoch, bs, seed):
    gen = torch.Generator().manual_seed(seed * 1000 + epoch * 10 + hvd.rank())
    for _ in range(STEPS_PER_EPOCH):
        x = torch.randn(bs, 10, generator=gen)
        y = torch.bucketize(x[:, 0] + 0.5 * x[:, 3], torch.tensor([-0.5, 0.5]))
        yield x, y


def run(args, max_epochs):
    model, optimizer = build(args)
    start = restore(args, model, optimizer)
    if hvd.rank() == 0:
        logger.info("starting at epoch %d", start)
    for epoch in range(start, max_epochs):
        model.train()
        for i, (x, y) in enumerate(batches_for_epoch(epoch, args.batch_size, args.seed)):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            gstep = epoch * STEPS_PER_EPOCH + i + 1
            print(f"CORPUS rank={hvd.rank()} step={gstep} loss={loss.item():.6f}", flush=True)
        save_checkpoint(args, model, optimizer, epoch + 1)
    return model


def main():
    args = args_parser().parse_args()
    hvd.init()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO)

    # fresh start: remove stale checkpoints from previous runs of this script
    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        for f in glob.glob(os.path.join(args.checkpoint_dir, CKPT_FORMAT.format(epoch="*"))):
            os.remove(f)
    hvd.barrier()

    first_leg = args.stop_after if args.stop_after else args.epochs
    model = run(args, first_leg)
    if first_leg < args.epochs:
        # --- simulated preemption: everything is rebuilt from scratch ---
        del model
        hvd.barrier()
        model = run(args, args.epochs)

    total = sum(p.double().sum() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
