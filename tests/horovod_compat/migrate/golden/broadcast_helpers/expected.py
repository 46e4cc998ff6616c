import torch
import atexit
import gc
import os
import torch.distributed as dist


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


def _native_broadcast_object(obj, root_rank=0, process_set=None):
    """hvd.broadcast_object on torch.distributed: root_rank's (picklable) object on every rank
    (of process_set, a _NativeProcessSet, when given; root_rank is a global rank)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=root_rank, group=process_set.group if process_set is not None else None)
    return box[0]


def _native_allgather_object(obj):
    """hvd.allgather_object on torch.distributed: the list of every rank's object, in rank order."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _native_broadcast(tensor, root_rank, inplace=False, process_set=None):
    """hvd.broadcast on torch.distributed: root_rank's values, in a new tensor (or in place).
    root_rank is a global rank, also with a process_set (a _NativeProcessSet), as in Horovod."""
    import torch
    import torch.distributed as dist

    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        raise RuntimeError("hvd.broadcast was differentiable; broadcast tensor.detach() instead")
    out = tensor if inplace else tensor.detach().clone()
    with torch.no_grad():
        dist.broadcast(out, src=root_rank, group=process_set.group if process_set is not None else None)
    return out

if not dist.is_initialized():
    import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.Adam(model.parameters())
if dist.get_rank() == 0:
    model.load_state_dict(torch.load("/tmp/ckpt.pt"))
# Only rank 0 loaded the checkpoint: these broadcasts must stay.
_native_broadcast_parameters(model.state_dict(), root_rank=0)
_native_broadcast_optimizer_state(optimizer, root_rank=0)
start_epoch = _native_broadcast_object(7, 0)
everyone = _native_allgather_object({"rank": dist.get_rank()})
weights = _native_broadcast(torch.ones(3), 0)
