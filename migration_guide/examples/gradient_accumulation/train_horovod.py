"""Worked example: gradient accumulation with `backward_passes_per_step`.

Horovod averages across ranks only on every 3rd backward pass; the rewriter turns this loop
into DDP's `no_sync()` on the other passes.  train_horovod.py is the original, train_ddp.py the
rewriter's output.  Run either with:
    python -m torch.distributed.run --standalone --nproc_per_node=2 <file>
"""
import torch
import torch.nn.functional as F

import horovod.torch as hvd

PASSES = 3


def main():
    hvd.init()
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=3)

    gen = torch.Generator().manual_seed(200 + hvd.rank())
    batches = [(torch.randn(8, 5, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(12)]
    for i, (x, y) in enumerate(batches):
        loss = F.mse_loss(model(x), y) / PASSES
        loss.backward()
        if (i + 1) % 3 == 0:
            optimizer.step()
            optimizer.zero_grad()
            with torch.no_grad():
                check = F.mse_loss(model(x), y)
            if hvd.rank() == 0:
                print(f"step {i // 3} loss {loss.item() * PASSES:.6f} after {check.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
