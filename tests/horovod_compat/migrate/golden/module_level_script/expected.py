import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _native_sum(tensor):
    """hvd.allreduce(tensor, op=hvd.Sum): the sum over all ranks, in a new tensor (differentiable,
    as Horovod's)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_nn

    if tensor.requires_grad and torch.is_grad_enabled():
        return dist_nn.all_reduce(tensor)
    total = tensor.clone()
    dist.all_reduce(total)
    return total


def _native_average(tensor):
    """hvd.allreduce(tensor): the average over all ranks, in a new tensor (differentiable, as
    Horovod's; integer tensors truncate, as Horovod's did)."""
    import torch
    import torch.distributed as dist

    total = _native_sum(tensor)
    if total.is_floating_point() or total.is_complex():
        return total / dist.get_world_size()
    return torch.div(total, dist.get_world_size(), rounding_mode="trunc")


def _native_broadcast_optimizer_state(optimizer, root_rank):
    """hvd.broadcast_optimizer_state: root_rank's state and options on every rank. A fresh optimizer
    first steps on zero gradients, as Horovod's did (weights put back; differences.md)."""
    import torch
    import torch.distributed as dist

    if not optimizer.state:
        saved = [(p, p.detach().clone()) for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        for p, _ in saved:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
    state = [optimizer.state_dict()]
    dist.broadcast_object_list(state, src=root_rank)
    optimizer.load_state_dict(state[0])

train_dataset = test_loader = train_loader = None

parser = argparse.ArgumentParser()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return F.log_softmax(self.fc(x), dim=1)


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = ddp_model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = _native_average(tensor)
    return avg_tensor.item()


def test():
    model.eval()
    test_loss = 0.
    for data, target in test_loader:
        output = ddp_model(data)
        test_loss += F.nll_loss(output, target, size_average=False).item()
    test_loss = metric_average(test_loss, 'avg_loss')
    if dist.get_rank() == 0:
        print(test_loss)


if __name__ == '__main__':
    args = parser.parse_args()
    if not dist.is_initialized():
        import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
        # no launcher (torchrun sets RANK, mpirun its own): rank 0 of 1, as Horovod ran without one
        if not any(name in os.environ for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
            os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset)
    model = Net()
    lr_scaler = dist.get_world_size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
    _native_broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer.state.clear()  # as under Horovod: the wrap started without state
    ddp_model = DDP(model, forward_sync_buffers=False)
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test()
