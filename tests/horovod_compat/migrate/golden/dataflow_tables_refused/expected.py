import torch
import horovod.torch as hvd
import atexit
import gc
import os
import torch.distributed as dist

# TODO(horovod-compat): hvd.Compression.none: kept: Horovod calls remain in this file and work with Horovod's own compressors; once the file becomes native this is DDP's default_hooks.fp16_compress_hook or None
MUTATED = {"none": hvd.Compression.none}
# TODO(horovod-compat): hvd.Compression.fp16: kept: Horovod calls remain in this file and work with Horovod's own compressors; once the file becomes native this is DDP's default_hooks.fp16_compress_hook or None
MUTATED["fp16"] = hvd.Compression.fp16
# TODO(horovod-compat): hvd.Compression.none: kept: Horovod calls remain in this file and work with Horovod's own compressors; once the file becomes native this is DDP's default_hooks.fp16_compress_hook or None
COMPUTED_KEYS = {str(k): hvd.Compression.none for k in range(2)}
# TODO(horovod-compat): hvd.Average: kept: Horovod calls remain in this file and work with Horovod's own reduce ops; once the file becomes native this is "average"
# TODO(horovod-compat): hvd.Sum: kept: Horovod calls remain in this file and work with Horovod's own reduce ops; once the file becomes native this is "sum"
REDUCERS = {"mean": hvd.Average, "sum": hvd.Sum}


def mutated_table(cfg, x):
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
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: compression=MUTATED[cfg["compression"]] is not Compression.none/fp16 or a choice between them (`MUTATED` is used otherwise than read by a key, so it may change) (--emulate writes _native_distributed_optimizer here instead: Horovod's averaging in the optimizer, the same numbers)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=MUTATED[cfg["compression"]])
    model(x).sum().backward()
    opt.step()


def not_a_dict_literal(cfg, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: compression=COMPUTED_KEYS[cfg["compression"]] is not Compression.none/fp16 or a choice between them (`COMPUTED_KEYS` is not a dict literal of Horovod constants) (--emulate writes _native_distributed_optimizer here instead: Horovod's averaging in the optimizer, the same numbers)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=COMPUTED_KEYS[cfg["compression"]])
    model(x).sum().backward()
    opt.step()


def op_chosen_at_run_time(cfg, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: op=REDUCERS[cfg["op"]]: a reduce op chosen at run time from a table; DDP always averages gradients (--emulate writes _native_distributed_optimizer here instead: Horovod's averaging in the optimizer, the same numbers)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=REDUCERS[cfg["op"]])
    model(x).sum().backward()
    opt.step()


def missing_key(x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # TODO(horovod-compat): hvd.DistributedOptimizer: op=REDUCERS["max"]: not a Horovod reduce-op constant the rewriter can follow (`REDUCERS` has no key "max") (--emulate writes _native_distributed_optimizer here instead: Horovod's averaging in the optimizer, the same numbers)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=REDUCERS["max"])
    model(x).sum().backward()
    opt.step()
