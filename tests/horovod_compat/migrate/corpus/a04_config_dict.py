"""Global CFG-dict style (Kaggle / research notebooks turned scripts): one dict drives everything,
compression and optimizer looked up by string from small registries."""
import os
import sys
import math
import random
import tempfile

import numpy as np
import torch
import torch.nn as nn
import horovod.torch as hvd

CFG = {
    "seed": 2021,
    "lr": 3e-3,
    "epochs": 3,
    "batch_size": 24,
    "n_samples": 144,
    "n_features": 20,
    "hidden": [40, 40],
    "optimizer": "adamw",
    "weight_decay": 0.01,
    "compression": "none",   # "none" | "fp16"
    "warmup_steps": 3,
    "grad_clip": None,
    "print_every": 5,
    "out_dir": os.environ.get("CORPUS_TMP", tempfile.gettempdir()),
}

COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=CFG["lr"], weight_decay=CFG["weight_decay"]),
    "sgd": lambda params: torch.optim.SGD(params, lr=CFG["lr"], momentum=0.9),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=CFG["lr"]),
}


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dims = [cfg["n_features"]] + list(cfg["hidden"])
        blocks = []
        for a, b in zip(dims[:-1], dims[1:]):
            blocks += [nn.Linear(a, b), nn.GELU(), nn.LayerNorm(b)]
        self.body = nn.Sequential(*blocks)
        self.out = nn.Linear(dims[-1], 1)

    def forward(self, x):
        return self.out(self.body(x)).squeeze(-1)


def get_data(cfg, rank):
    # every rank gets its own shard, generated from the rank-offset seed
    rng = np.random.RandomState(cfg["seed"] + 100 * rank)
    X = rng.randn(cfg["n_samples"], cfg["n_features"]).astype(np.float32)
    logits = X[:, :5].sum(1) - X[:, 5:10].sum(1)
    y = (logits > 0).astype(np.float32)
    return torch.from_numpy(X), torch.from_numpy(y)


def lr_lambda(step):
    if step < CFG["warmup_steps"]:
        return float(step + 1) / CFG["warmup_steps"]
    return 0.5 * (1 + math.cos(math.pi * min(step, 30) / 30))


def run():
    hvd.init()
    torch.set_num_threads(1)
    seed_everything(CFG["seed"])
    rank, world = hvd.rank(), hvd.size()
    if rank == 0:
        print(f"world={world} cfg={CFG}")

    X, y = get_data(CFG, rank)
    model = MLP(CFG)
    opt = OPTIMIZERS[CFG["optimizer"]](model.parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=COMPRESSIONS[CFG["compression"]])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    loss_fn = nn.BCEWithLogitsLoss()
    gstep = 0
    bs = CFG["batch_size"]
    for ep in range(CFG["epochs"]):
        perm = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(CFG["seed"] + ep))
        for i in range(0, X.shape[0], bs):
            idx = perm[i:i + bs]
            xb, yb = X[idx], y[idx]
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            if CFG["grad_clip"]:
                opt.synchronize()
                nn.utils.clip_grad_norm_(model.parameters(), CFG["grad_clip"])
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
            sched.step()
            gstep += 1
            print(f"CORPUS rank={rank} step={gstep} loss={loss.item():.6f}", flush=True)
            if rank == 0 and gstep % CFG["print_every"] == 0:
                print(f"  ep {ep} step {gstep} lr {sched.get_last_lr()[0]:.5f}")

    s = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        s += p.double().sum()
    print(f"CORPUS rank={rank} final={s.item():.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
