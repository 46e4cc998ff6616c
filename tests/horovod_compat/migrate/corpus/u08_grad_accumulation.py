"""Style: gradient accumulation with backward_passes_per_step=2; two
micro-batches per optimizer step, loss scaled by the accumulation count."""
import argparse

import torch
import torch.nn as nn
import horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--accum-steps", type=int, default=2)
parser.add_argument("--optimizer-steps", type=int, default=6)
parser.add_argument("--micro-batch", type=int, default=4)
args = parser.parse_args()

hvd.init()
torch.manual_seed(8)


class TinyRegressor(nn.Module):
    def __init__(self):
        super(TinyRegressor, self).__init__()
        self.body = nn.Linear(3, 6)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        return self.out(torch.sigmoid(self.body(x)))


model = TinyRegressor()
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     backward_passes_per_step=args.accum_steps)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

g = torch.Generator().manual_seed(4242 + hvd.rank())
n = args.optimizer_steps * args.accum_steps * args.micro_batch
inputs = torch.randn(n, 3, generator=g)
targets = inputs[:, :1] - inputs[:, 1:2]
micro_batches = list(zip(inputs.split(args.micro_batch), targets.split(args.micro_batch)))

optimizer.zero_grad()
running = 0.0
step = 0
for i, (xb, yb) in enumerate(micro_batches):
    loss = nn.functional.mse_loss(model(xb), yb) / args.accum_steps
    loss.backward()
    running += loss.item()
    if (i + 1) % args.accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        print(f"CORPUS rank={hvd.rank()} step={step} loss={running:.6f}", flush=True)
        running = 0.0

weights_total = 0.0
for param in model.parameters():
    if param.requires_grad:
        weights_total += float(param.data.sum())
print(f"CORPUS rank={hvd.rank()} final={weights_total:.6f}", flush=True)
