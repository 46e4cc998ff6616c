import torch
import horovod.torch as hvd


def _native_allreduce(tensor, op="average", inplace=False, compression=None, prescale_factor=1.0,
                      postscale_factor=1.0):
    """hvd.allreduce on torch.distributed: reduce over all ranks into a new tensor (or in place).

    op is "average" (sum, then divide by the world size; integer tensors truncate, as Horovod
    did), "sum", "min", "max" or "product". compression=default_hooks.fp16_compress_hook (what
    hvd.Compression.fp16 became) reduces a floating tensor in float16; the scale factors multiply
    before and after the reduction. A tensor that requires grad goes through
    torch.distributed.nn, which is differentiable.
    """
    import torch
    import torch.distributed as dist

    ops = {"average": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
    if op not in ops:
        raise ValueError(f"allreduce op {op!r}: torch.distributed reduces with one of {sorted(ops)}"
                         + (" (Adasum has no torch.distributed equivalent)" if op == "adasum" else ""))
    world = dist.get_world_size()
    wire = None
    if compression is not None:
        wire = {"fp16_compress_hook": torch.float16, "bf16_compress_hook": torch.bfloat16}.get(
            getattr(compression, "__name__", None))
        if wire is None:
            raise ValueError(f"compression={compression!r}: expected None or DDP's fp16_compress_hook")
    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        if op not in ("average", "sum"):
            raise RuntimeError("differentiable allreduce supports only average and sum")
        import torch.distributed.nn.functional as dist_nn

        out = dist_nn.all_reduce(tensor * prescale_factor, op=dist.ReduceOp.SUM)
        return (out / world if op == "average" else out) * postscale_factor
    out = tensor.detach().clone() if not inplace or prescale_factor != 1.0 else tensor
    if prescale_factor != 1.0:
        out.mul_(prescale_factor)
    wired = out.to(wire) if wire is not None and out.is_floating_point() else out
    dist.all_reduce(wired, op=ops[op])
    if op == "average":  # in the wire's dtype, as Horovod scaled its compressed buffer
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
        return tensor
    return out


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = _native_allreduce(tensor, "average")
    return avg_tensor.item()


def report(correct, total, loss):
    n_correct = _native_allreduce(torch.tensor(correct), "sum")
    n_total = _native_allreduce(torch.tensor(total), "sum")
    worst = _native_allreduce(loss, "max")
    counts = torch.tensor([3, 4])
    _native_allreduce(counts, "average", inplace=True)  # integer average truncates, as in Horovod
    # TODO(horovod-compat): hvd.allreduce: op=Adasum has no torch.distributed equivalent; it is not a plain average
    odd = hvd.allreduce(loss, op=hvd.Adasum)
    scaled = _native_allreduce(loss, "average", prescale_factor=0.5)
    return n_correct, n_total, worst, counts, odd, scaled
