import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class _NativeProcessSet:
    """hvd.ProcessSet on torch.distributed: the sorted global `ranks` and their dist.new_group.

    Making a group is collective, as Horovod's add_process_set was: every rank makes every set,
    in the same order. A set made before dist.init_process_group gets its group from register().
    rank() is this process's rank inside the set (-1 outside it); size() and included() as in
    Horovod. Collective helpers take it as process_set=; remove() destroys the group.
    """

    def __init__(self, ranks):
        import torch.distributed as dist

        self.ranks = sorted(getattr(ranks, "ranks", ranks))
        self.group = None
        if dist.is_initialized():
            self.register()
            if isinstance(ranks, _NativeProcessSet):  # add_process_set(ProcessSet(...))
                ranks.group = self.group

    def register(self):
        import torch.distributed as dist

        if self.group is None:
            self.group = dist.new_group(self.ranks)
        return self

    def remove(self):
        import torch.distributed as dist

        if self.included():
            dist.destroy_process_group(self.group)
        self.group = None
        return True

    def size(self):
        return len(self.ranks)

    def rank(self):
        import torch.distributed as dist

        return self.ranks.index(dist.get_rank()) if self.included() else -1

    def included(self):
        import torch.distributed as dist

        return dist.get_rank() in self.ranks


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
    halves = [_NativeProcessSet(list(range(0, dist.get_world_size(), 2))),
              _NativeProcessSet(list(range(1, dist.get_world_size(), 2)))]
    mine = halves[dist.get_rank() % 2]
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ddp_net = DDP(net, forward_sync_buffers=False, process_group=None if mine is None else mine.group)
    ddp_net.register_comm_hook(ddp_net.process_group, default_hooks.fp16_compress_hook)
    head = torch.nn.Linear(4, 1)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.1)
    ddp_head = DDP(head, forward_sync_buffers=False)
    for _ in range(3):
        opt.zero_grad()
        head_opt.zero_grad()
        (ddp_net(torch.randn(8, 4)).sum() + ddp_head(torch.randn(8, 4)).sum()).backward()
        opt.step()
        head_opt.step()
