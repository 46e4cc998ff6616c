"""Lifecycle and topology queries."""
import atexit
import gc
import os
import torch.distributed as dist
import torch

if not dist.is_initialized():
    import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
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
