import torch
import horovod.torch as hvd
import atexit
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import contextlib


def train(loader, model):
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    hvd.init()
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


def zero_grad_every_pass(loader, model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: backward_passes_per_step=2: DDP needs `with ddp_model.no_sync():` around all but the last backward() of every group; the rewriter only does that for `for i, ... in enumerate(...)` with `if (i + 1) % 2 == 0: optimizer.step()` (zero_grad() outside that `if` would drop the accumulated gradients)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=2)
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        model(x).sum().backward()
        if (i + 1) % 2 == 0:
            optimizer.step()


def other_condition(loader, model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: backward_passes_per_step=2: DDP needs `with ddp_model.no_sync():` around all but the last backward() of every group; the rewriter only does that for `for i, ... in enumerate(...)` with `if (i + 1) % 2 == 0: optimizer.step()`
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=2)
    for step, (x, y) in enumerate(loader):
        model(x).sum().backward()
        if step % 3 == 0:
            optimizer.step()
            optimizer.zero_grad()
