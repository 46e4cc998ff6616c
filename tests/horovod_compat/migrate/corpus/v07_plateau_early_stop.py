"""Style: Keras-callback-like PyTorch loop: ReduceLROnPlateau and early stopping driven by a validation loss averaged across workers with hvd.allreduce(name=...).
"""
import torch
import torch.nn as nn

import horovod.torch as hvd


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def validate(model, val_x, val_y, criterion):
    model.eval()
    with torch.no_grad():
        loss = criterion(model(val_x), val_y).item()
    model.train()
    return metric_average(loss, "avg_val_loss")


class EarlyStopping:
    def __init__(self, patience=1, min_delta=0.0):
        self.patience = patience
        self.min_delta = min_delta
        self.best = float("inf")
        self.bad_epochs = 0

    def step(self, metric):
        if metric < self.best - self.min_delta:
            self.best = metric
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs > self.patience


def main():
    hvd.init()
    torch.manual_seed(21)
    torch.set_num_threads(1)

    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02 * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5,
                                                           patience=0)
    stopper = EarlyStopping(patience=1)
    criterion = nn.SmoothL1Loss()

    gen = torch.Generator().manual_seed(31 + hvd.rank())
    coef = torch.tensor([[1.0], [-2.0], [0.5], [0.0], [3.0]])
    val_x = torch.randn(16, 5, generator=gen)
    val_y = val_x @ coef

    step = 0
    for epoch in range(4):
        for _ in range(2):
            x = torch.randn(8, 5, generator=gen)
            y = x @ coef + 0.3 * torch.randn(8, 1, generator=gen)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
            step += 1
        val_loss = validate(model, val_x, val_y, criterion)
        scheduler.step(val_loss)
        if stopper.step(val_loss):
            break

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
