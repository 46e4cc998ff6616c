"""Transfer-learning script in the style of config-dict driven fine-tuning repos:
partially frozen backbone, per-module LR param groups, gradient accumulation via
backward_passes_per_step."""
import os
import math
import random

import numpy as np
import torch
import torch.nn as nn
import horovod.torch as hvd

CONFIG = {
    "seed": 3,
    "model": {
        "in_dim": 16,
        "width": 32,
        "n_classes": 5,
        "freeze": ["stem", "layer1"],
    },
    "optim": {
        "name": "sgd",
        "backbone_lr": 0.002,
        "head_lr": 0.02,
        "momentum": 0.9,
        "weight_decay": 1.0e-4,
    },
    "train": {
        "micro_batch": 8,
        "accum_steps": 2,
        "steps": 12,
        "log_every": 4,
    },
}


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Backbone(nn.Module):
    def __init__(self, in_dim, width):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(in_dim, width), nn.LayerNorm(width), nn.ReLU())
        self.layer1 = nn.Sequential(nn.Linear(width, width), nn.ReLU())
        self.layer2 = nn.Sequential(nn.Linear(width, width), nn.ReLU())

    def forward(self, x):
        return self.layer2(self.layer1(self.stem(x)))


class Classifier(nn.Module):
    def __init__(self, mcfg):
        super().__init__()
        self.backbone = Backbone(mcfg["in_dim"], mcfg["width"])
        self.head = nn.Sequential(nn.Dropout(0.0), nn.Linear(mcfg["width"], mcfg["n_classes"]))

    def forward(self, x):
        return self.head(self.backbone(x))


def freeze_modules(model, names):
    for name in names:
        mod = getattr(model.backbone, name)
        for p in mod.parameters():
            p.requires_grad = False
    n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    n_total = sum(p.numel() for p in model.parameters())
    return n_frozen, n_total


def build_optimizer(model, ocfg):
    groups = [
        {"params": [p for p in model.backbone.parameters() if p.requires_grad],
         "lr": ocfg["backbone_lr"], "name": "backbone"},
        {"params": list(model.head.parameters()), "lr": ocfg["head_lr"], "name": "head"},
    ]
    opt = torch.optim.SGD(groups, lr=ocfg["head_lr"], momentum=ocfg["momentum"],
                          weight_decay=ocfg["weight_decay"])
    return opt


def synthetic_stream(rank, cfg):
    g = torch.Generator().manual_seed(cfg["seed"] * 7919 + rank)
    proto = torch.randn(cfg["model"]["n_classes"], cfg["model"]["in_dim"],
                        generator=torch.Generator().manual_seed(11))
    while True:
        y = torch.randint(0, cfg["model"]["n_classes"], (cfg["train"]["micro_batch"],), generator=g)
        x = proto[y] + 0.8 * torch.randn(len(y), cfg["model"]["in_dim"], generator=g)
        yield x, y


def main(cfg):
    torch.set_num_threads(1)
    hvd.init()
    seed_everything(cfg["seed"])

    model = Classifier(cfg["model"])
    n_frozen, n_total = freeze_modules(model, cfg["model"]["freeze"])
    if hvd.rank() == 0:
        print(f"frozen {n_frozen}/{n_total} params", flush=True)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = build_optimizer(model, cfg["optim"])
    tcfg = cfg["train"]
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=tcfg["accum_steps"])
    criterion = nn.CrossEntropyLoss()

    # frozen stem also keeps its norm stats / dropout in eval mode
    model.train()
    model.backbone.stem.eval()
    stream = synthetic_stream(hvd.rank(), cfg)

    for step in range(tcfg["steps"]):
        optimizer.zero_grad()
        step_loss = 0.0
        for micro in range(tcfg["accum_steps"]):
            x, y = next(stream)
            loss = criterion(model(x), y) / tcfg["accum_steps"]
            loss.backward()
            step_loss += loss.item()
        optimizer.step()
        if not math.isfinite(step_loss):
            raise RuntimeError("loss diverged")
        print(f"CORPUS rank={hvd.rank()} step={step} loss={step_loss:.6f}", flush=True)
        if hvd.rank() == 0 and step % tcfg["log_every"] == 0:
            lrs = {g["name"]: g["lr"] for g in optimizer.param_groups}
            print(f"  step {step}: lrs={lrs}", flush=True)

    final = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    print(f"CORPUS rank={hvd.rank()} final={final.item():.6f}", flush=True)


if __name__ == "__main__":
    main(CONFIG)
