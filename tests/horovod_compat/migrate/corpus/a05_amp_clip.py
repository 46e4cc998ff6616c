"""Mixed-precision training loop as written for GPU jobs (GradScaler + autocast), with Horovod's
synchronize() / unscale_ / clip_grad_norm_ / skip_synchronize() dance; scaler disabled on CPU."""
import argparse
import logging
import os
from contextlib import nullcontext

import torch
import torch.nn as nn
import horovod.torch as hvd

logging.basicConfig(format="[%(levelname)s] %(message)s", level=logging.INFO)
LOGGER = logging.getLogger("amp-train")


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--amp", action="store_true", help="enable autocast + loss scaling")
    ap.add_argument("--max-grad-norm", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1337)
    return ap.parse_args()


class GRUClassifier(nn.Module):
    def __init__(self, vocab: int, emb: int = 16, hid: int = 24, n_classes: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.GRU(emb, hid, batch_first=True)
        self.cls = nn.Linear(hid, n_classes)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.cls(h[:, -1])


def synthetic_batch(gen: torch.Generator, bs: int, seq_len: int, vocab: int):
    tokens = torch.randint(0, vocab, (bs, seq_len), generator=gen)
    labels = (tokens[:, :3].sum(1) % 3).long()
    return tokens, labels


def main():
    args = get_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    use_cuda_amp = args.amp and device.type == "cuda"

    model = GRUClassifier(args.vocab).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # on CPU boxes (CI) the scaler is a no-op but the code path is the same
    scaler = torch.amp.GradScaler(device.type, enabled=use_cuda_amp)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.float16)
                if use_cuda_amp else nullcontext())
    criterion = nn.CrossEntropyLoss()

    gen = torch.Generator().manual_seed(args.seed * 10 + hvd.rank())
    model.train()
    for step in range(1, args.steps + 1):
        tokens, labels = synthetic_batch(gen, args.batch_size, args.seq_len, args.vocab)
        tokens, labels = tokens.to(device), labels.to(device)

        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(tokens)
            loss = criterion(logits, labels)

        scaler.scale(loss).backward()
        # Horovod: make sure all async allreduce ops are done before unscaling
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()

        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        if hvd.rank() == 0 and step % 5 == 0:
            LOGGER.info("step %d loss %.4f grad_norm %.4f scale %s", step, loss.item(),
                        float(grad_norm), scaler.get_scale() if use_cuda_amp else "n/a")

    with torch.no_grad():
        param_sum = torch.stack([p.double().sum() for p in model.parameters()]).sum()
    print(f"CORPUS rank={hvd.rank()} final={param_sum.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
