import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.distributed._composable import replicate


def evaluate(model, x):
    with torch.no_grad():
        return model(x).sum().item()


def main(x):
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
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros)
    for _ in range(3):
        optimizer.zero_grad()
        model(x).sum().backward()
        # torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  (a comment: not a gradient read)
        optimizer.step()
    print(evaluate(model, x))
