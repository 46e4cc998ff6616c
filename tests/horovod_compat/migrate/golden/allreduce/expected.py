import torch
import horovod.torch as hvd


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
    # TODO(horovod-compat): hvd.allreduce: argument prescale_factor= is not rewritten (only tensor, op/average and name are)
    scaled = hvd.allreduce(loss, prescale_factor=0.5)
    return n_correct, n_total, worst, counts, odd, scaled
