"""Style: argparse script picking the model from a registry -- a dict of
constructors plus getattr() on a namespace of model factories."""
import argparse
import types

import torch
from torch import nn

from horovod import torch as hvd


def mlp_small():
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def mlp_wide():
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))


MODEL_REGISTRY = {
    "mlp_small": mlp_small,
    "mlp_wide": mlp_wide,
}

zoo = types.SimpleNamespace(**MODEL_REGISTRY)


def build_model(name, use_getattr):
    if use_getattr:
        return getattr(zoo, name)()
    if name not in MODEL_REGISTRY:
        raise KeyError(f"unknown model {name}")
    return MODEL_REGISTRY[name]()


def parse_args():
    parser = argparse.ArgumentParser(description="registry training")
    parser.add_argument("--arch", default="mlp_small", choices=sorted(MODEL_REGISTRY))
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-getattr", dest="use_getattr", action="store_false")
    return parser.parse_args()


args = parse_args()
hvd.init()
torch.manual_seed(7)

model = build_model(args.arch, args.use_getattr)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * 0.1)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

gen = torch.Generator().manual_seed(hvd.rank() + 11)
features = torch.randn(args.steps * 8, 6, generator=gen)
labels = (features[:, :3].argmax(dim=1))
criterion = nn.CrossEntropyLoss()

for step in range(args.steps):
    xb = features[step * 8:(step + 1) * 8]
    yb = labels[step * 8:(step + 1) * 8]
    optimizer.zero_grad()
    loss = criterion(model(xb), yb)
    loss.backward()
    optimizer.step()
    print(f"CORPUS rank={hvd.rank()} step={step + 1} loss={loss.item():.6f}", flush=True)

total = sum(p.sum().item() for p in model.parameters() if p.requires_grad)
print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)
