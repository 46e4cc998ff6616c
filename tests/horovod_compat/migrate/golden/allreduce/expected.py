import torch
import horovod.torch as hvd


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
    """What hvd.allreduce_async, broadcast_async or allgather_async returned: is_completed() is
    hvd.poll, wait() is hvd.synchronize (the op's work, None for one done already, then `finish`
    to scale and copy the result, once)."""

    def __init__(self, work, finish):
        self.work, self.finish = work, finish

    def is_completed(self):
        return self.work is None or self.work.is_completed()

    def wait(self):
        if self.finish is not None:
            if self.work is not None:
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


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = _native_average(tensor)
    return avg_tensor.item()


def report(correct, total, loss):
    n_correct = _native_sum(torch.tensor(correct))
    n_total = _native_sum(torch.tensor(total))
    worst = _native_allreduce(loss, "max")
    counts = torch.tensor([3, 4])
    _native_allreduce(counts, "average", inplace=True)  # integer average truncates, as in Horovod
    # TODO(horovod-compat): hvd.allreduce: op=Adasum has no torch.distributed equivalent; it is not a plain average
    odd = hvd.allreduce(loss, op=hvd.Adasum)
    scaled = _native_allreduce(loss, "average", prescale_factor=0.5)
    return n_correct, n_total, worst, counts, odd, scaled
