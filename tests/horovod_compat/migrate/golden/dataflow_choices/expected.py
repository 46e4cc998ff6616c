import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def _native_sum_gradients(process_group, bucket):
    """DDP comm hook for hvd.DistributedOptimizer(op=hvd.Sum): each gradient bucket summed over
    the ranks (process_group None: all of them), where DDP's own reduction averages."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


def named_choices(args, x):
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
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = default_hooks.fp16_compress_hook if args.fp16 else None
    if args.adasum:
        op = "adasum"
    else:
        op = "average"
    ddp_model = DDP(model, forward_sync_buffers=False)  # Horovod: Adasum when op == "adasum"; DDP averages
    if compression is not None:
        ddp_model.register_comm_hook(None, compression)
    ddp_model(x).sum().backward()
    opt.step()


def inline_choices(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model_2 = DDP(model, forward_sync_buffers=False)  # Horovod: Adasum when args.use_adasum; DDP averages
    if (not args.exact and args.fp16):
        ddp_model_2.register_comm_hook(None, default_hooks.fp16_compress_hook)
    ddp_model_2(x).sum().backward()
    opt.step()


def name_used_twice(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = default_hooks.fp16_compress_hook if args.fp16 else None
    print(compression)
    ddp_model_3 = DDP(model, forward_sync_buffers=False)
    if compression is not None:
        ddp_model_3.register_comm_hook(None, compression)
    ddp_model_3(x).sum().backward()


def sum_branch(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model_4 = DDP(model, forward_sync_buffers=False)
    if args.sum:
        ddp_model_4.register_comm_hook(None, _native_sum_gradients)  # op=hvd.Sum: gradients summed, not averaged
    ddp_model_4(x).sum().backward()
