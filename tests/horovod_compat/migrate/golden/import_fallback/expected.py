"""Horovod imported if present, as libraries and shared training scripts do."""
import torch

import atexit
import os
import torch.distributed as dist


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
    total = _native_allreduce(torch.ones(1), "sum")
    print(f"rank {dist.get_rank()} total {total.item()}")


if __name__ == "__main__":
    main()
