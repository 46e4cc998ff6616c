import horovod.torch as hvd
import atexit
import gc
import os
import torch
import torch.distributed as dist

if not dist.is_initialized():
    import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
hvd.init()
rank = dist.get_rank()
# TODO(horovod-compat): hvd.alltoall: dist.all_to_all_single takes explicit input/output split sizes; returned splits must be exchanged first
sizes = hvd.alltoall(torch.tensor([rank]))
