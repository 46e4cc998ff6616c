"""Horovod imported name by name and by submodule, as real projects do."""
import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


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


def _native_broadcast_object(obj, root_rank=0, process_set=None):
    """hvd.broadcast_object on torch.distributed: root_rank's (picklable) object on every rank
    (of process_set, a _NativeProcessSet, when given; root_rank is a global rank)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=root_rank, group=process_set.group if process_set is not None else None)
    return box[0]


def main():
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
    model = torch.nn.Linear(2, 1)
    for tensor in model.state_dict().values():  # hvd.broadcast_parameters
        dist.broadcast(tensor, src=0)
    x = _native_average(torch.ones(2) * dist.get_rank())
    cfg = _native_broadcast_object({"lr": 0.1}, 0)
    try:
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} x {x.tolist()} cfg {cfg}")
    except dist.DistBackendError:
        raise


def shadowed(allreduce=None):
    return allreduce  # the parameter, not Horovod's: left alone


if __name__ == "__main__":
    elastic_launch(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id="horovod_run", max_restarts=0), main)()
