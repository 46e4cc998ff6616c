import torch
import atexit
import gc
import os
import torch.distributed as dist


def _native_broadcast_optimizer_state(optimizer, root_rank):
    """hvd.broadcast_optimizer_state: root_rank's state and options on every rank. A fresh optimizer
    first steps on zero gradients, as Horovod's did (weights put back; differences.md)."""
    import torch
    import torch.distributed as dist

    if not optimizer.state:
        saved = [(p, p.detach().clone()) for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        for p, _ in saved:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
    state = [optimizer.state_dict()]
    dist.broadcast_object_list(state, src=root_rank)
    optimizer.load_state_dict(state[0])


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
    # no launcher (torchrun sets RANK, mpirun its own): rank 0 of 1, as Horovod ran without one
    if not any(name in os.environ for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.Adam(model.parameters())
if dist.get_rank() == 0:
    model.load_state_dict(torch.load("/tmp/ckpt.pt"))
# Only rank 0 loaded the checkpoint: these broadcasts must stay.
for tensor in model.state_dict().values():  # hvd.broadcast_parameters
    dist.broadcast(tensor, src=0)
_native_broadcast_optimizer_state(optimizer, root_rank=0)
start_epoch = _native_broadcast_object(7, 0)
best = _native_broadcast_object(0.5)  # the name as the third positional argument
everyone = _native_allgather_object({"rank": dist.get_rank()})
weights = _native_broadcast(torch.ones(3), 0)
