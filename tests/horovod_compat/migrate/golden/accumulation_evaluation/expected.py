import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import contextlib

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
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ddp_model = DDP(model, forward_sync_buffers=False)


def train(loader):
    model.train()
    for i, (x, y) in enumerate(loader):
        with contextlib.nullcontext() if (i + 1) % 2 == 0 else ddp_model.no_sync():
            loss = torch.nn.functional.mse_loss(ddp_model(x), y) / 2
            loss.backward()
        if (i + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()


def evaluate(loader):
    # no torch.no_grad(), as in Horovod's MNIST example: nothing here can reach a backward pass
    model.eval()
    total = 0.0
    for x, y in loader:
        total += torch.nn.functional.mse_loss(ddp_model(x), y).item()
    print("eval loss", total / len(loader))


@torch.no_grad()
def predict(x):
    return ddp_model(x)
