import horovod
import torch
import distributor
import atexit
import os
import torch.distributed as dist


def work(scale, offset=0):
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return dist.get_rank() * scale + offset


if __name__ == "__main__":
    results = distributor.run_function(work, 10, num_processes=2, return_all=True, offset=1)
    print(results)
    single = distributor.run_function(work, 3, num_processes=1, return_all=True)
    # TODO(horovod-compat): horovod.run: horovod.run(max_np, min_np=...) is elastic; launch the script with torchrun --nnodes=MIN:MAX --max-restarts=K instead (see the guide)
    elastic = horovod.run(work, args=(1,), np=2, min_np=1, max_np=4)
    print(torch.__version__)
