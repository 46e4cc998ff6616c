import math

import torch
import horovod.torch as hvd
import atexit
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import contextlib


def train(loader, args):
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    hvd.init()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model = DDP(model, forward_sync_buffers=False)
    for data, target in loader:
        optimizer.zero_grad()
        for i in range(0, len(data), args.sub_batch):
            with contextlib.nullcontext() if i + args.sub_batch >= len(data) else ddp_model.no_sync():
                output = ddp_model(data[i:i + args.sub_batch])
                loss = torch.nn.functional.mse_loss(output, target[i:i + args.sub_batch])
                loss.div_(math.ceil(len(data) / args.sub_batch))
                loss.backward()
        print("sub-batches done")
        optimizer.step()


def step_inside_the_inner_loop(loader, args):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: backward_passes_per_step=args.passes: DDP needs `with ddp_model.no_sync():` around all but the last backward() of every group; the rewriter only does that for `for i, ... in enumerate(...)` with `if (i + 1) % args.passes == 0: optimizer.step()`
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=args.passes)
    for data, target in loader:
        for i in range(0, len(data), args.sub_batch):
            model(data[i:i + args.sub_batch]).sum().backward()
            optimizer.step()
