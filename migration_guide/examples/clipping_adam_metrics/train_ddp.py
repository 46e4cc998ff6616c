"""Worked example: gradient clipping, Adam and integer metrics.

The Horovod idioms that change meaning under DDP: `optimizer.synchronize()` +
`skip_synchronize()` around clipping, `broadcast_optimizer_state` on a fresh Adam, and integer
`hvd.allreduce` (Sum, and Average which truncates).  train_horovod.py is the original,
train_ddp.py the rewriter's output.  Run either with:
    python -m torch.distributed.run --standalone --nproc_per_node=2 <file>
"""
import torch
import torch.nn.functional as F

import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _native_broadcast_optimizer_state(optimizer, root_rank):
    """hvd.broadcast_optimizer_state: root_rank's state and options on every rank. A fresh optimizer
    first steps on zero gradients, as Horovod's did (weights put back; differences.md)."""
    import torch
    import torch.distributed as dist

    if not optimizer.state:
        saved = [(p, p.detach().clone()) for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        for p, _ in saved:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
    state = [optimizer.state_dict()]
    dist.broadcast_object_list(state, src=root_rank)
    optimizer.load_state_dict(state[0])


def _native_sum(tensor):
    """hvd.allreduce(tensor, op=hvd.Sum): the sum over all ranks, in a new tensor (differentiable,
    as Horovod's)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_nn

    if tensor.requires_grad and torch.is_grad_enabled():
        return dist_nn.all_reduce(tensor)
    total = tensor.clone()
    dist.all_reduce(total)
    return total


def _native_average(tensor):
    """hvd.allreduce(tensor): the average over all ranks, in a new tensor (differentiable, as
    Horovod's; integer tensors truncate, as Horovod's did)."""
    import torch
    import torch.distributed as dist

    total = _native_sum(tensor)
    if total.is_floating_point() or total.is_complex():
        return total / dist.get_world_size()
    return torch.div(total, dist.get_world_size(), rounding_mode="trunc")


def main():
    if not dist.is_initialized():
        import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
        # no launcher (torchrun sets RANK, mpirun its own): rank 0 of 1, as Horovod ran without one
        if not any(name in os.environ for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
            os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    ddp_model = DDP(model, forward_sync_buffers=False)
    _native_broadcast_optimizer_state(optimizer, root_rank=0)

    # Each rank draws its own batches.
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for step in range(8):
        x = torch.randn(32, 6, generator=gen)
        y = torch.randint(0, 3, (32,), generator=gen)
        optimizer.zero_grad()
        out = ddp_model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
        correct = (out.argmax(dim=1) == y).sum()
        total_correct = _native_sum(correct)
        mean_correct = _native_average(correct)  # integer: truncates
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.6f} grad_norm {grad_norm.item():.6f} "
                  f"correct {int(total_correct)} mean_correct {int(mean_correct)}", flush=True)


if __name__ == "__main__":
    main()
