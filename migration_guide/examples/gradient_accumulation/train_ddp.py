"""Worked example: gradient accumulation with `backward_passes_per_step`.

Horovod averages across ranks only on every 3rd backward pass; the rewriter turns this loop
into DDP's `no_sync()` on the other passes.  train_horovod.py is the original, train_ddp.py the
rewriter's output.  Run either with:
    python -m torch.distributed.run --standalone --nproc_per_node=2 <file>
"""
import torch
import torch.nn.functional as F

import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import contextlib

PASSES = 3


def main():
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
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp_model = DDP(model, forward_sync_buffers=False)

    gen = torch.Generator().manual_seed(200 + dist.get_rank())
    batches = [(torch.randn(8, 5, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(12)]
    for i, (x, y) in enumerate(batches):
        with contextlib.nullcontext() if (i + 1) % 3 == 0 else ddp_model.no_sync():
            loss = F.mse_loss(ddp_model(x), y) / PASSES
            loss.backward()
        if (i + 1) % 3 == 0:
            optimizer.step()
            optimizer.zero_grad()
            with torch.no_grad():
                check = F.mse_loss(ddp_model(x), y)
            if dist.get_rank() == 0:
                print(f"step {i // 3} loss {loss.item() * PASSES:.6f} after {check.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
