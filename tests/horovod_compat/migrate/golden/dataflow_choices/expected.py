import torch
import horovod.torch as hvd
import atexit
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def named_choices(args, x):
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    hvd.init()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = default_hooks.fp16_compress_hook if args.fp16 else None
    if args.adasum:
        op = "adasum"
    else:
        op = "average"
    if op == "adasum":
        raise NotImplementedError(
            "input.py:14: op=hvd.Adasum has no torch.distributed/DDP equivalent; train with averaging "
            "(and retune the learning rate) or keep this job on horovod-compat. See "
            "migration_guide/differences.md, 'op=Adasum: no native equivalent'.")
    ddp_model = DDP(model, forward_sync_buffers=False)
    if compression is not None:
        ddp_model.register_comm_hook(None, compression)
    ddp_model(x).sum().backward()
    opt.step()


def inline_choices(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.use_adasum:
        raise NotImplementedError(
            "input.py:24: op=hvd.Adasum has no torch.distributed/DDP equivalent; train with averaging "
            "(and retune the learning rate) or keep this job on horovod-compat. See "
            "migration_guide/differences.md, 'op=Adasum: no native equivalent'.")
    ddp_model_2 = DDP(model, forward_sync_buffers=False)
    if (not args.exact and args.fp16):
        ddp_model_2.register_comm_hook(None, default_hooks.fp16_compress_hook)
    ddp_model_2(x).sum().backward()
    opt.step()


def name_used_twice(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.Compression.fp16: compression outside DistributedOptimizer has no native form
    # TODO(horovod-compat): hvd.Compression.none: compression outside DistributedOptimizer has no native form
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    print(compression)
    # TODO(horovod-compat): hvd.DistributedOptimizer: compression=compression is not Compression.none/fp16 or a choice between them (`compression` is used elsewhere too; the rewriter only follows a name used once)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)
    model(x).sum().backward()


def sum_branch(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: op=hvd.Sum: DDP always averages gradients
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   op=hvd.Sum if args.sum else hvd.Average)
    model(x).sum().backward()
