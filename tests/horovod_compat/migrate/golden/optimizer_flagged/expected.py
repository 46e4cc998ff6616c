import torch
import horovod.torch as hvd
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed._composable import replicate


def accumulate():
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
    hvd.init()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros); averages every backward() (Horovod: every 4)
    return model, opt


def passes_model_around(evaluate):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros)
    evaluate(model)


def adasum():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model = DDP(model, forward_sync_buffers=False)  # Horovod: Adasum; DDP averages


def no_named_parameters(model):
    replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return opt


def clips_without_synchronize(x):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model_2 = DDP(model, forward_sync_buffers=False)
    ddp_model_2(x).sum().backward()
    # DDP: the gradients are averaged here already (Horovod, without synchronize(): not yet)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def wrapped_inside_a_loop(x):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        model(x).sum().backward()
        if epoch == 0:
            # TODO(horovod-compat): hvd.DistributedOptimizer: the optimizer is wrapped inside a loop; calls before it in the loop body could not be redirected; not in place either: the wrap sits inside a loop over `epoch`, and `model` does not change with it: replicate() makes a module data-parallel only once (--emulate writes _native_distributed_optimizer here instead: Horovod's averaging in the optimizer, the same numbers)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        opt.step()


def moved_after_the_wrap(x):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    replicate(model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros)
    model.cuda()
    model(x.cuda()).sum().backward()
