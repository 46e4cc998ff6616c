"""Small native functions the rewriter inserts when a Horovod call has no one-line equivalent.

Each helper is plain ``torch.distributed`` code that reproduces what the Horovod call did (the
facts are in docs/horovod_torch_api.md), and imports what it uses inside its body, so it works
wherever it is pasted, including in a notebook cell or a function pickled by TorchDistributor.
They are inserted at module level after the file's leading imports, once per file.
"""
from __future__ import annotations

from typing import Dict

HELPERS: Dict[str, str] = {
    "_native_allreduce": '''
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
''',
    "_native_broadcast": '''
def _native_broadcast(tensor, root_rank, inplace=False):
    """hvd.broadcast on torch.distributed: root_rank's values, in a new tensor (or in place)."""
    import torch
    import torch.distributed as dist

    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        raise RuntimeError("hvd.broadcast was differentiable; broadcast tensor.detach() instead")
    out = tensor if inplace else tensor.detach().clone()
    with torch.no_grad():
        dist.broadcast(out, src=root_rank)
    return out
''',
    "_native_broadcast_parameters": '''
def _native_broadcast_parameters(params, root_rank):
    """hvd.broadcast_parameters on torch.distributed: copy root_rank's tensors to every rank.

    Accepts what Horovod accepted: a state_dict (broadcast in sorted key order), or a list of
    (name, tensor) pairs or of tensors.
    """
    import torch
    import torch.distributed as dist

    if isinstance(params, dict):
        tensors = [t for _, t in sorted(params.items())]
    elif isinstance(params, list):
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    with torch.no_grad():
        for t in tensors:
            if isinstance(t, torch.Tensor):
                dist.broadcast(t.data, src=root_rank)
''',
    "_native_broadcast_optimizer_state": '''
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
''',
    "_native_broadcast_object": '''
def _native_broadcast_object(obj, root_rank=0):
    """hvd.broadcast_object on torch.distributed: root_rank's (picklable) object on every rank."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]
''',
    "_native_allgather_object": '''
def _native_allgather_object(obj):
    """hvd.allgather_object on torch.distributed: the list of every rank's object, in rank order."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
''',
}
