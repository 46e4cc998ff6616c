"""Style: library-style code -- a HorovodStrategy backend class wrapping
init/rank/DistributedOptimizer/broadcast behind methods, and a tiny custom
optimizer class (plain SGD) defined in the library."""
import torch
from torch import nn
from torch.optim import Optimizer

import horovod.torch as hvd


class PlainSGD(Optimizer):
    """Minimal SGD used by the library."""

    def __init__(self, params, lr=0.01):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
        return loss


class HorovodStrategy:
    name = "horovod"

    def setup(self):
        hvd.init()

    @property
    def global_rank(self):
        return hvd.rank()

    @property
    def world_size(self):
        return hvd.size()

    def wrap_optimizer(self, optimizer, model):
        return hvd.DistributedOptimizer(optimizer,
                                        named_parameters=model.named_parameters())

    def broadcast_model(self, model):
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def reduce(self, value, name):
        return hvd.allreduce(torch.tensor(value), name=name).item()


class Engine:
    def __init__(self, strategy, model, lr):
        self.strategy = strategy
        self.model = model
        strategy.broadcast_model(model)
        self.opt = strategy.wrap_optimizer(PlainSGD(model.parameters(), lr=lr), model)

    def run(self, batches):
        for i, (x, y) in enumerate(batches, 1):
            self.opt.zero_grad()
            loss = nn.functional.smooth_l1_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
            print(f"CORPUS rank={self.strategy.global_rank} step={i} loss={loss.item():.6f}",
                  flush=True)
        avg = self.strategy.reduce(loss.item(), name="last_loss")
        if self.strategy.global_rank == 0:
            print(f"mean last loss over {self.strategy.world_size} workers: {avg:.4f}")


strategy = HorovodStrategy()
strategy.setup()
torch.manual_seed(strategy.global_rank + 5)  # different init; broadcast fixes it
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
g = torch.Generator().manual_seed(21 + strategy.global_rank)
batches = [(x, x[:, :2] * 2.0) for x in (torch.randn(12, 4, generator=g) for _ in range(6))]
engine = Engine(strategy, model, lr=0.1)
engine.run(batches)
final = sum(p.sum().item() for p in model.parameters() if p.requires_grad)
print(f"CORPUS rank={strategy.global_rank} final={final:.6f}", flush=True)
