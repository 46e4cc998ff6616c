"""Style: a Trainer class holding self.model / self.optimizer, with the
DistributedOptimizer built inside the class constructor."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class Trainer:
    def __init__(self, lr=0.05):
        torch.manual_seed(42)
        self.model = Net()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr * hvd.size(),
                                         momentum=0.9)
        self.optimizer = hvd.DistributedOptimizer(
            self.optimizer, named_parameters=self.model.named_parameters())
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        self.global_step = 0

    def train_step(self, x, y):
        self.model.train()
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.global_step += 1
        return loss.item()

    def fit(self, data, epochs):
        for _ in range(epochs):
            for x, y in data:
                loss = self.train_step(x, y)
                print(f"CORPUS rank={hvd.rank()} step={self.global_step} loss={loss:.6f}",
                      flush=True)

    def weight_sum(self):
        return sum(p.detach().sum().item() for p in self.model.parameters()
                   if p.requires_grad)


def make_data(rank, n_batches=4, batch=16):
    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, 8, generator=g)
        y = x.sum(dim=1, keepdim=True) * 0.5
        out.append((x, y))
    return out


def main():
    hvd.init()
    trainer = Trainer()
    trainer.fit(make_data(hvd.rank()), epochs=2)
    print(f"CORPUS rank={hvd.rank()} final={trainer.weight_sum():.6f}", flush=True)


main()
