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
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _native_broadcast_optimizer_state(optimizer, root_rank):
    """hvd.broadcast_optimizer_state on torch.distributed, with Horovod's exact behaviour.

    Like Horovod, an optimizer with no state yet first takes one step on zero gradients to
    create its state (this advances e.g. Adam's step counter); then root_rank's state and
    options (lr, momentum, ...) are loaded on every rank.  On a fresh optimizer under DDP the
    call is not needed at all; removing it changes the trajectory slightly for stateful optimizers.
    """
    import torch
    import torch.distributed as dist

    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        optimizer.step()
        state_dict = optimizer.state_dict()
    box = [state_dict]
    dist.broadcast_object_list(box, src=root_rank)
    optimizer.load_state_dict(box[0])


def _native_allreduce(tensor, op="average", inplace=False):
    """hvd.allreduce on torch.distributed: reduce over all ranks into a new tensor (or in place).

    "average" sums then divides by the world size; integer tensors truncate, as Horovod did.
    A tensor that requires grad goes through torch.distributed.nn, which is differentiable.
    """
    import torch
    import torch.distributed as dist

    ops = {"average": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
    world = dist.get_world_size()
    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        if op not in ("average", "sum"):
            raise RuntimeError("differentiable allreduce supports only average and sum")
        import torch.distributed.nn.functional as dist_nn

        out = dist_nn.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return out / world if op == "average" else out
    out = tensor if inplace else tensor.detach().clone()
    dist.all_reduce(out, op=ops[op])
    if op == "average":
        if out.is_floating_point() or out.is_complex():
            out.div_(world)
        else:
            out.copy_(torch.div(out, world, rounding_mode="trunc"))
    return out


def make_data():
    # The same synthetic data set on every rank; the sampler gives each rank its share.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def main():
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
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
            avg_loss = _native_allreduce(loss.detach(), "average")
            if dist.get_rank() == 0:
                print(f"step {step} loss {loss.item():.6f} avg {avg_loss.item():.6f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
