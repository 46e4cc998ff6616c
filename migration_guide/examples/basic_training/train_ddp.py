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
    """hvd.broadcast_optimizer_state on torch.distributed, with Horovod's exact behaviour.

    Like Horovod, an optimizer with no state yet first takes one step on zero gradients to
    create its state (this advances e.g. Adam's step counter; the weights are put back after it,
    so weight decay does not move them, as on horovod-compat); then root_rank's state and
    options (lr, momentum, ...) are loaded on every rank.  On a fresh optimizer under DDP the
    call is not needed at all; removing it changes the trajectory slightly for stateful optimizers.
    """
    import contextlib

    import torch
    import torch.distributed as dist

    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        saved = [(p, p.detach().clone()) for group in optimizer.param_groups
                 for p in group["params"] if p.requires_grad]
        for p, _ in saved:
            p.grad = torch.zeros_like(p)
        # a distributed optimizer steps without reducing: the other ranks may already have state
        skip = getattr(optimizer, "skip_synchronize", contextlib.nullcontext)
        with skip():
            optimizer.step()
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
        state_dict = optimizer.state_dict()
    box = [state_dict]
    dist.broadcast_object_list(box, src=root_rank)
    optimizer.load_state_dict(box[0])


def _native_wire_dtype(compression):
    """The dtype Horovod's compression sent tensors in: None (no compression), or float16 for
    hvd.Compression.fp16, which became DDP's default_hooks.fp16_compress_hook (bf16 likewise)."""
    import torch

    if compression is None:
        return None
    wire = {"fp16_compress_hook": torch.float16, "bf16_compress_hook": torch.bfloat16}.get(
        getattr(compression, "__name__", None))
    if wire is None:
        raise ValueError(f"compression={compression!r}: expected None or DDP's fp16_compress_hook")
    return wire


class _NativeHandle:
    """What hvd.allreduce_async returned: is_completed() is hvd.poll, wait() is hvd.synchronize
    (the reduction's work, then `finish` to scale and copy the result, once)."""

    def __init__(self, work, finish):
        self.work, self.finish = work, finish

    def is_completed(self):
        return self.work.is_completed()

    def wait(self):
        if self.finish is not None:
            self.work.wait()
            self.result, self.finish = self.finish(), None
        return self.result


def _native_allreduce_async(tensor, op="average", inplace=False, compression=None,
                            prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """hvd.allreduce_async on torch.distributed: starts the reduction over all ranks into a new
    tensor (or in place) and returns its handle: handle.wait() (hvd.synchronize) finishes it and
    returns the result, handle.is_completed() is hvd.poll.

    op is "average" (sum, then divide by the world size; integer tensors truncate, as Horovod
    did), "sum", "min", "max" or "product". compression=default_hooks.fp16_compress_hook (what
    hvd.Compression.fp16 became) reduces a floating tensor in float16; the scale factors multiply
    before and after the reduction; process_set (a _NativeProcessSet) reduces over its ranks only.
    """
    import torch
    import torch.distributed as dist

    ops = {"average": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
    if op not in ops:
        raise ValueError(f"allreduce op {op!r}: torch.distributed reduces with one of {sorted(ops)}"
                         + (" (Adasum has no torch.distributed equivalent)" if op == "adasum" else ""))
    group = process_set.group if process_set is not None else None
    wire = _native_wire_dtype(compression)
    out = tensor.detach().clone() if not inplace or prescale_factor != 1.0 else tensor
    if prescale_factor != 1.0:
        out.mul_(prescale_factor)
    wired = out.to(wire) if wire is not None and out.is_floating_point() else out
    announce = globals().get("_native_join_announce")  # the program calls hvd.join()
    if announce is not None and group is None:
        announce(2, wired.numel(), wired.dtype)
    work = dist.all_reduce(wired, op=ops[op], group=group, async_op=True)

    def finish():
        if op == "average":  # in the wire's dtype, as Horovod scaled its compressed buffer
            world = dist.get_world_size(group)
            if wired.is_floating_point() or wired.is_complex():
                wired.div_(world)
            else:
                wired.copy_(torch.div(wired, world, rounding_mode="trunc"))
        if postscale_factor != 1.0:
            wired.mul_(postscale_factor)
        if wired is not out:
            out.copy_(wired)
        if inplace and out is not tensor:
            tensor.copy_(out)
        return tensor if inplace else out

    return _NativeHandle(work, finish)


def _native_allreduce(tensor, op="average", inplace=False, **options):
    """hvd.allreduce on torch.distributed: _native_allreduce_async(...).wait(), with the same
    options. A tensor that requires grad goes through torch.distributed.nn, which is
    differentiable (average and sum).
    """
    import torch

    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        import torch.distributed as dist
        import torch.distributed.nn.functional as dist_nn

        if op not in ("average", "sum") or options.get("compression") is not None:
            raise RuntimeError("a differentiable allreduce averages or sums, uncompressed")
        ps = options.get("process_set")
        group = ps.group if ps is not None else dist.group.WORLD
        out = dist_nn.all_reduce(tensor * options.get("prescale_factor", 1.0), op=dist.ReduceOp.SUM, group=group)
        out = out / dist.get_world_size(group) if op == "average" else out
        return out * options.get("postscale_factor", 1.0)
    return _native_allreduce_async(tensor, op, inplace, **options).wait()


def make_data():
    # The same synthetic data set on every rank; the sampler gives each rank its share.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def main():
    if not dist.is_initialized():
        import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
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
            avg_loss = _native_allreduce(loss.detach(), "average")
            if dist.get_rank() == 0:
                print(f"step {step} loss {loss.item():.6f} avg {avg_loss.item():.6f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
