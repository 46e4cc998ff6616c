"""Rows per rank differ: predictions of an evaluation loop, gathered for a metric."""
import torch
import atexit
import gc
import os
import torch.distributed as dist


def _native_allgather(tensor, process_set=None):
    """hvd.allgather on torch.distributed: every rank's tensor (of process_set, a
    _NativeProcessSet, when given) concatenated along dim 0, in rank order. The first dimension
    may differ between ranks: the sizes are gathered first and each tensor is padded to the
    largest. Differentiable as Horovod's was: the gradient is averaged over the ranks and each
    rank keeps the rows it gave.
    """
    import torch
    import torch.distributed as dist

    group = process_set.group if process_set is not None else None

    def gather(t):
        t = t.contiguous()
        rows = torch.tensor([t.shape[0]], device=t.device)
        sizes = [torch.zeros_like(rows) for _ in range(dist.get_world_size(group))]
        dist.all_gather(sizes, rows, group=group)
        sizes = [int(s.item()) for s in sizes]
        padded = t.new_zeros((max(sizes), *t.shape[1:]))
        padded[:t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)]), sizes

    class AllGather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            out, sizes = gather(t)
            ctx.rows = (sum(sizes[:dist.get_rank(group)]), t.shape[0])
            return out

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous().clone()
            dist.all_reduce(grad, group=group)
            start, count = ctx.rows
            return grad[start:start + count] / dist.get_world_size(group)

    if tensor.requires_grad and torch.is_grad_enabled():
        return AllGather.apply(tensor)
    return gather(tensor.detach())[0]

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
preds = torch.arange(dist.get_rank() + 2, dtype=torch.float32)
everything = _native_allgather(preds)
labels = _native_allgather(torch.ones(dist.get_rank() + 1, 3, dtype=torch.int64))
weights = torch.ones(dist.get_rank() + 1, 2, requires_grad=True)
_native_allgather(weights).pow(2).sum().backward()
print(f"rank {dist.get_rank()} all {everything.tolist()} labels {labels.sum().item()} grad {weights.grad.tolist()}")
