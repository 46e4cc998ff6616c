from sparkdl import HorovodRunner
import torch
import functools
from pyspark.ml.torch.distributor import TorchDistributor

params = {"lr": 0.1}
np_workers = 4


def train(lr=0.01, epochs=1):
    import atexit
    import gc
    import os
    import torch.distributed as dist
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
    return dist.get_rank()


hr = TorchDistributor(num_processes=2, local_mode=False, use_gpu=torch.cuda.is_available())
hr.run(functools.partial(train, lr=0.1, epochs=2))
TorchDistributor(num_processes=2, local_mode=True, use_gpu=torch.cuda.is_available()).run(train)
result = TorchDistributor(num_processes=abs(np_workers), local_mode=np_workers < 0, use_gpu=torch.cuda.is_available()).run(functools.partial(train, **params))
# TODO(horovod-compat): HorovodRunner: np=0 was deprecated in HorovodRunner; choose num_processes and local_mode
HorovodRunner(np=0).run(train)
