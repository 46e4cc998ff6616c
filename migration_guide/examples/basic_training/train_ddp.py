"""Worked example: a typical Horovod PyTorch training script.

train_horovod.py is the Horovod original; train_ddp.py is what `horovod-compat-migrate` makes of
it (the tests check that, and that both print the same losses).  Run either with:
    python -m torch.distributed.run --standalone --nproc_per_node=2 <file>
Rank 0 prints one line per step: the local loss and the loss averaged over all ranks.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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


def make_data():
    # The same synthetic data set on every rank; the sampler gives each rank its share.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


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

    # Different initial weights per rank on purpose: the broadcast from rank 0 must fix that.
    torch.manual_seed(1234 + dist.get_rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    dataset = make_data()
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    # Horovod recipe: scale the learning rate by the number of workers.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * dist.get_world_size(), momentum=0.9)
    ddp_model = DDP(model, forward_sync_buffers=False)
    _native_broadcast_optimizer_state(optimizer, root_rank=0)

    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            avg_loss = _native_average(loss.detach())
            if dist.get_rank() == 0:
                print(f"step {step} loss {loss.item():.6f} avg {avg_loss.item():.6f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
