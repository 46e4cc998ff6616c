"""Demo: DDP training of a small model on synthetic data, 2 ranks on the CPU, via TorchDistributor.

Run with `bash scripts/demo.sh` (it installs what is needed first).
"""
from distributor import TorchDistributor


def train(epochs: int, lr: float) -> float:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(2048, 16)
    y = x @ torch.linspace(-1, 1, 16).unsqueeze(1) + 0.1 * torch.randn(2048, 1)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(xb), len(xb)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0] / total[1]:.4f}")
    final = (total[0] / total[1]).item()
    dist.destroy_process_group()
    return final


if __name__ == "__main__":
    loss = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 5, 0.05)
    print(f"final loss returned to the driver: {loss:.4f}")
