"""Lifecycle and topology queries."""
import atexit
import gc
import os
import torch.distributed as dist
import torch

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

print("rank %d of %d" % (dist.get_rank(), dist.get_world_size()))
print(int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["GROUP_RANK"]), (dist.get_world_size() // int(os.environ["LOCAL_WORLD_SIZE"])))
nodes_per_gpu = 8 / (dist.get_world_size() // int(os.environ["LOCAL_WORLD_SIZE"]))
assert dist.is_initialized()
if dist.is_nccl_available() and dist.is_gloo_available() and not False:
    print("both backends")
if dist.is_initialized():
    dist.destroy_process_group()
