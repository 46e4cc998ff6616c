"""A trainer class holding model and optimizer, as real projects write it: the model travels, so
no DDP wrap can be proven, and its forward() is handed out as a value, to be called past the hooks
of a replicated module; under --emulate the optimizer averages the gradients itself (gradient hooks)."""
import torch
import horovod.torch as hvd


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(6, 8)
        self.head = torch.nn.Linear(8, 1)
        self.unused = torch.nn.Linear(3, 3)  # never in the forward pass: a zero gradient

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def evaluate(forward, x):
    with torch.no_grad():
        return forward(x).mean().item()


class Trainer:
    def __init__(self, model, lr, passes, fp16):
        self.model = model
        self.optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.none,
            backward_passes_per_step=passes)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.passes = passes

    def step(self, batches):
        self.optimizer.zero_grad()
        for x, y in batches[:self.passes]:
            torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.synchronize()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        self.scheduler.step()
        return norm.item()


def main():
    hvd.init()
    torch.manual_seed(0)
    model = Net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    trainer = Trainer(model, lr=0.05, passes=2, fp16=False)
    g = torch.Generator().manual_seed(100 + hvd.rank())
    for step in range(6):
        batches = [(torch.randn(5 + hvd.rank(), 6, generator=g), torch.randn(5 + hvd.rank(), 1, generator=g))
                   for _ in range(2)]
        norm = trainer.step(batches)
        print(f"rank {hvd.rank()} step {step} norm {norm:.6f} eval {evaluate(model.forward, batches[0][0]):.6f}")
    total = sum(p.sum().item() for p in model.parameters())
    print(f"rank {hvd.rank()} final {total:.6f}")


if __name__ == "__main__":
    main()
