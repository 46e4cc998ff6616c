"""Style: fine-tuning recipe with backbone/head param groups (different lr and weight decay) and a LambdaLR linear warmup whose peak lr is scaled by hvd.size().
"""
import torch
import torch.nn as nn

import horovod.torch as hvd


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU())

    def forward(self, x):
        return self.layers(x)


class FineTuneModel(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.backbone = Backbone()
        self.head = nn.Linear(24, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


BASE_LR = 0.01
WARMUP_STEPS = 3
TOTAL_STEPS = 7


def warmup_lambda(step):
    if step < WARMUP_STEPS:
        return float(step + 1) / WARMUP_STEPS
    return max(0.0, float(TOTAL_STEPS - step) / float(TOTAL_STEPS - WARMUP_STEPS))


def main():
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    model = FineTuneModel()
    lr_scaler = hvd.size()
    param_groups = [
        {"params": model.backbone.parameters(), "lr": BASE_LR * 0.1 * lr_scaler, "weight_decay": 1e-4},
        {"params": model.head.parameters(), "lr": BASE_LR * lr_scaler, "weight_decay": 0.0},
    ]
    optimizer = torch.optim.SGD(param_groups, lr=BASE_LR * lr_scaler, momentum=0.9)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=warmup_lambda)

    gen = torch.Generator().manual_seed(77 + 13 * hvd.rank())
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    for step in range(TOTAL_STEPS):
        x = torch.randn(10, 6, generator=gen)
        y = torch.randint(0, 4, (10,), generator=gen)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
