"""`import horovod.torch` without an alias, every use spelled out as horovod.torch.NAME."""
import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


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


def train():
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
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    ddp_model = DDP(model, forward_sync_buffers=False)
    for step in range(3):
        optimizer.zero_grad()
        loss = ddp_model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        mean = _native_average(loss.detach())
        if dist.get_rank() == 0:
            print(step, mean.item())


if __name__ == "__main__":
    train()
