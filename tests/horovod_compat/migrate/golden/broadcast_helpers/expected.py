import torch
import atexit
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


def _native_broadcast_object(obj, root_rank=0):
    """hvd.broadcast_object on torch.distributed: root_rank's (picklable) object on every rank."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def _native_allgather_object(obj):
    """hvd.allgather_object on torch.distributed: the list of every rank's object, in rank order."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


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

if not dist.is_initialized():
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
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
