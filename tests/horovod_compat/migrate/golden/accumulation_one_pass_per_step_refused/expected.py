import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.distributed._composable import replicate


class Trainer:
    def __init__(self, model, passes):
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
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros); averages every backward() (Horovod: every passes)

    def train(self, loader):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            if not torch.isfinite(loss):
                continue  # a skipped step: the next step() follows two backward passes
            self.optimizer.step()
            self.optimizer.zero_grad()
