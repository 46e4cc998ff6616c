import horovod.torch as hvd
import atexit
import os
import torch
import torch.distributed as dist

if not dist.is_initialized():
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
hvd.init()
rank = dist.get_rank()
# TODO(horovod-compat): hvd.allgather: Horovod concatenates tensors whose first dimension may differ between ranks; dist.all_gather needs equal sizes (gather the sizes first and pad), or use dist.all_gather_object for small data
sizes = hvd.allgather(torch.tensor([rank]))
