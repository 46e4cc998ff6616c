import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed._composable import replicate


def _native_sum_gradients(process_group, bucket):
    """DDP comm hook for hvd.DistributedOptimizer(op=hvd.Sum): each gradient bucket summed over
    the ranks (process_group None: all of them), where DDP's own reduction averages."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])

COMPRESSIONS = {"none": None, "fp16": default_hooks.fp16_compress_hook}
REDUCERS = {"mean": "average", "sum": "sum"}
ONLY_FP16 = {0: default_hooks.fp16_compress_hook}


def compression_from_config(cfg, x):
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
    ddp_model = DDP(model, forward_sync_buffers=False)
    if COMPRESSIONS[cfg["compression"]] is not None:
        ddp_model.register_comm_hook(None, COMPRESSIONS[cfg["compression"]])
    ddp_model(x).sum().backward()
    opt.step()


def op_by_literal_key(x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model_2 = DDP(model, forward_sync_buffers=False)
    ddp_model_2(x).sum().backward()
    opt.step()


def sum_by_literal_key(x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model_3 = DDP(model, forward_sync_buffers=False)
    ddp_model_3.register_comm_hook(None, default_hooks.fp16_compress_wrapper(_native_sum_gradients))  # op=hvd.Sum: gradients summed, not averaged, sent as float16
    ddp_model_3(x).sum().backward()
    opt.step()


class Trainer:
    def __init__(self, model, compression):
        self.model = model
        self.compression = compression

    def make_optimizer(self):
        # the compressor comes from the caller: in a native file it is DDP's fp16 hook or None
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        replicate(self.model, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None (Horovod: zeros)
        if self.compression is not None:  # fp16_compress_hook or None (hvd.Compression.fp16/none, once its caller is migrated)
            self.model.register_comm_hook(None, self.compression)
        return optimizer


def with_a_trainer(x):
    trainer = Trainer(torch.nn.Linear(4, 2), default_hooks.fp16_compress_hook)
    opt = trainer.make_optimizer()
    trainer.model(x).sum().backward()
    opt.step()
