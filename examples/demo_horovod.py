"""Demo: an unchanged Horovod training function, run by HorovodRunner on the driver only.

Nothing below mentions horovod-compat: `import horovod.torch as hvd` and `from sparkdl import
HorovodRunner` resolve to this project. Two ranks start on this host under mpirun (np=-2), train
a small model on synthetic data with hvd.DistributedOptimizer, and rank 0's result comes back.

Run with `bash scripts/demo.sh` (it installs what is needed first).
"""
from sparkdl import HorovodRunner


def train_hvd(learning_rate, epochs=5):
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    import horovod.torch as hvd
    from sparkdl.horovod import log_to_driver

    hvd.init()
    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    y = x @ torch.linspace(-1, 1, 16).unsqueeze(1) + 0.1 * torch.randn(4096, 1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(data), target)
            loss.backward()
            optimizer.step()
        epoch_loss = hvd.allreduce(loss.detach(), name="epoch_loss").item()
        if hvd.rank() == 0:
            log_to_driver(f"epoch {epoch}: loss {epoch_loss:.4f} (averaged over {hvd.size()} ranks)")
    return epoch_loss


if __name__ == "__main__":
    final_loss = HorovodRunner(np=-2).run(train_hvd, learning_rate=0.01)
    print(f"final loss returned to the driver: {final_loss:.4f}")
