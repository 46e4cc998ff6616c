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


def main():
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
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
        total_correct = _native_allreduce(correct, "sum")
        mean_correct = _native_allreduce(correct, "average")  # integer: truncates
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.6f} grad_norm {grad_norm.item():.6f} "
                  f"correct {int(total_correct)} mean_correct {int(mean_correct)}", flush=True)


if __name__ == "__main__":
    main()
