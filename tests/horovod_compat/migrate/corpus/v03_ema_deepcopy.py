"""Style: timm/YOLO-style ModelEMA: an exponential-moving-average copy made with copy.deepcopy before the optimizer is wrapped, updated after every step.

Uses the plain `import horovod.torch` form and calls the fully qualified API.
"""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class ModelEMA:
    def __init__(self, model, decay=0.9, tau=4):
        self.ema = copy.deepcopy(model).eval()
        self.updates = 0
        self.decay_fn = lambda n: decay * (1 - math.exp(-n / tau))
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model):
        self.updates += 1
        d = self.decay_fn(self.updates)
        msd = model.state_dict()
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:
                v.mul_(d).add_(msd[k].detach(), alpha=1 - d)


def main():
    horovod.torch.init()
    torch.manual_seed(3)
    torch.set_num_threads(1)
    rank = horovod.torch.rank()

    model = SmallConvNet()
    # Sync the weights first so that every rank's EMA starts from the same point.
    horovod.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    ema = ModelEMA(model)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * horovod.torch.size(),
                                momentum=0.9, nesterov=True)
    optimizer = horovod.torch.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    horovod.torch.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(2024 + rank)
    for step in range(8):
        images = torch.randn(6, 1, 8, 8, generator=gen)
        targets = torch.randint(0, 5, (6,), generator=gen)
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), targets)
        loss.backward()
        optimizer.step()
        ema.update(model)
        print(f"CORPUS rank={rank} step={step} loss={loss.item():.6f}", flush=True)

    # Validation uses the EMA weights; average the metric over workers.
    with torch.no_grad():
        val_x = torch.randn(10, 1, 8, 8, generator=gen)
        val_y = torch.randint(0, 5, (10,), generator=gen)
        val_loss = F.cross_entropy(ema.ema(val_x), val_y)
    val_loss = horovod.torch.allreduce(val_loss, name="ema_val_loss")
    _ = val_loss.item()

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={rank} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
