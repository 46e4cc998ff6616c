"""Databricks HorovodRunner notebook style: a self-contained `train(lr, epochs)`
that imports horovod and calls hvd.init() inside (it would be passed to
`HorovodRunner(np=2).run(train, ...)`); here it is simply called from __main__.
"""
import os
import tempfile

import torch
import torch.nn as nn

torch.set_num_threads(1)

CHECKPOINT_DIR = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b06_ckpt")


def get_dataset(rank=0, size=1, n_total=256):
    # the "full" dataset is the same everywhere; each worker takes a strided shard
    g = torch.Generator().manual_seed(314)
    x = torch.rand(n_total, 6, generator=g) * 4 - 2
    y = (torch.sin(x[:, 0]) + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] ** 2).unsqueeze(1)
    return x[rank::size], y[rank::size]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 50), nn.SiLU(), nn.Linear(50, 30), nn.SiLU(), nn.Linear(30, 1))

    def forward(self, x):
        return self.layers(x)


def save_checkpoint(log_dir, model, optimizer, epoch):
    filepath = log_dir + '/checkpoint-{epoch}.pth.tar'.format(epoch=epoch)
    state = {
        'model': model.state_dict(),
        'optimizer': optimizer.state_dict(),
    }
    torch.save(state, filepath)


def train_one_epoch(model, device, data_loader, optimizer, epoch, rank, step0):
    model.train()
    loss_fn = nn.SmoothL1Loss()
    step = step0
    for batch_idx, (data, target) in enumerate(data_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        step += 1
        print(f"CORPUS rank={rank} step={step} loss={loss.item():.6f}", flush=True)
        if batch_idx % 4 == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(data_loader.dataset),
                100. * batch_idx / len(data_loader), loss.item()))
    return step


def train(lr=0.01, epochs=2):
    import horovod.torch as hvd
    hvd.init()

    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if device.type == 'cuda':
        # Pin GPU to local rank
        torch.cuda.set_device(hvd.local_rank())

    torch.manual_seed(1)
    x, y = get_dataset(hvd.rank(), hvd.size())
    train_dataset = torch.utils.data.TensorDataset(x, y)
    # no sampler here: data is already sharded by rank; keep order fixed
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=16, shuffle=False)

    model = MLP().to(device)

    # Horovod: scale the learning rate by the number of workers
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * hvd.size())

    # Horovod: broadcast initial variable states from rank 0 to all other processes
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    step = 0
    for epoch in range(1, epochs + 1):
        step = train_one_epoch(model, device, train_loader, optimizer, epoch, hvd.rank(), step)
        # Save checkpoints only on worker 0 to prevent conflicts between workers
        if hvd.rank() == 0:
            save_checkpoint(CHECKPOINT_DIR, model, optimizer, epoch)

    total = sum(p.detach().double().sum() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={float(total):.6f}", flush=True)
    return float(total)


if __name__ == "__main__":
    os.makedirs(CHECKPOINT_DIR, exist_ok=True)
    # hr = HorovodRunner(np=2)
    # hr.run(train, lr=0.01, epochs=2)
    train()
