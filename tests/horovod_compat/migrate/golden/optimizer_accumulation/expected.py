import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed._composable import replicate
import contextlib


def train(loader, width):
    model = torch.nn.Linear(width, 1)
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
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model = DDP(model, forward_sync_buffers=False)
    for epoch in range(2):
        for i, (x, y) in enumerate(loader):
            with contextlib.nullcontext() if (i + 1) % 4 == 0 else ddp_model.no_sync():
                out = ddp_model(x)  # forward
                loss = torch.nn.functional.mse_loss(out, y) / 4
                loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
        with torch.no_grad():
            print(ddp_model(x).sum())


def zero_grad_every_pass(loader, width):
    model = torch.nn.Linear(width, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros); averages every backward() (Horovod: every 2)
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        model(x).sum().backward()
        if (i + 1) % 2 == 0:
            optimizer.step()


def other_condition(loader, width):
    model = torch.nn.Linear(width, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros); averages every backward() (Horovod: every 2)
    for step, (x, y) in enumerate(loader):
        model(x).sum().backward()
        if step % 3 == 0:
            optimizer.step()
            optimizer.zero_grad()
