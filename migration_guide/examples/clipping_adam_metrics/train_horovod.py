"""Worked example: gradient clipping, Adam and integer metrics.

The Horovod idioms that change meaning under DDP: `optimizer.synchronize()` +
`skip_synchronize()` around clipping, `broadcast_optimizer_state` on a fresh Adam, and integer
`hvd.allreduce` (Sum, and Average which truncates).  train_horovod.py is the original,
train_ddp.py the rewriter's output.  Run either with:
    python -m torch.distributed.run --standalone --nproc_per_node=2 <file>
"""
import torch
import torch.nn.functional as F

import horovod.torch as hvd


def main():
    hvd.init()
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Each rank draws its own batches.
    gen = torch.Generator().manual_seed(100 + hvd.rank())
    for step in range(8):
        x = torch.randn(32, 6, generator=gen)
        y = torch.randint(0, 3, (32,), generator=gen)
        optimizer.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        optimizer.synchronize()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        with optimizer.skip_synchronize():
            optimizer.step()
        correct = (out.argmax(dim=1) == y).sum()
        total_correct = hvd.allreduce(correct, op=hvd.Sum, name="correct")
        mean_correct = hvd.allreduce(correct, name="mean_correct")  # integer: truncates
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.item():.6f} grad_norm {grad_norm.item():.6f} "
                  f"correct {int(total_correct)} mean_correct {int(mean_correct)}", flush=True)


if __name__ == "__main__":
    main()
