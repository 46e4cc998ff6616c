import horovod
import torch
import functools
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
import atexit
import gc
import os
import torch.distributed as dist


def work(scale, offset=0):
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
    return dist.get_rank() * scale + offset


if __name__ == "__main__":
    results = [value for _, value in sorted(elastic_launch(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id="horovod_run", max_restarts=0), functools.update_wrapper(functools.partial(work, offset=1), work))(10).items())]
    print(results)
    single = [value for _, value in sorted(elastic_launch(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id="horovod_run", max_restarts=0), work)(3).items())]
    # TODO(horovod-compat): horovod.run: horovod.run(max_np, min_np=...) is elastic; launch the script with torchrun --nnodes=MIN:MAX --max-restarts=K instead (see the guide)
    elastic = horovod.run(work, args=(1,), np=2, min_np=1, max_np=4)
    print(torch.__version__)
