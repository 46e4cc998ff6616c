"""Style: classic Horovod ImageNet-example layout -- Dataset + DistributedSampler
(num_replicas=hvd.size(), rank=hvd.rank()), metrics averaged with
hvd.allreduce(tensor, name=...), predictions gathered with hvd.allgather."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data.distributed
from torch.utils.data import DataLoader, TensorDataset

import horovod.torch as hvd


class Metric(object):
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.)
        self.n = torch.tensor(0.)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


class ConvNet(nn.Module):
    def __init__(self):
        super(ConvNet, self).__init__()
        self.conv = nn.Conv2d(1, 3, kernel_size=3)
        self.fc = nn.Linear(3 * 4 * 4, 3)

    def forward(self, x):
        x = F.relu(self.conv(x))
        return self.fc(x.view(x.size(0), -1))


hvd.init()
torch.manual_seed(17)

g = torch.Generator().manual_seed(0)  # same full dataset everywhere
images = torch.randn(96, 1, 6, 6, generator=g)
labels = (images.mean(dim=(1, 2, 3)) > 0).long() + (images[:, 0, 0, 0] > 1).long()
train_set = TensorDataset(images[:64], labels[:64])
val_set = TensorDataset(images[64:], labels[64:])

train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
val_sampler = torch.utils.data.distributed.DistributedSampler(
    val_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
val_loader = DataLoader(val_set, batch_size=16, sampler=val_sampler)

model = ConvNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

step = 0
for epoch in range(2):
    train_sampler.set_epoch(epoch)
    model.train()
    train_loss = Metric("train_loss")
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        train_loss.update(loss)
        step += 1
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
    if hvd.rank() == 0:
        print(f"epoch {epoch} avg train loss {train_loss.avg.item():.4f}", flush=True)

model.eval()
val_loss = Metric("val_loss")
preds = []
with torch.no_grad():
    for data, target in val_loader:
        out = model(data)
        val_loss.update(F.cross_entropy(out, target))
        preds.append(out.argmax(dim=1))
all_preds = hvd.allgather(torch.cat(preds), name="val_preds")
all_targets = hvd.allgather(torch.cat([t for _, t in val_loader]), name="val_targets")
accuracy = (all_preds == all_targets).float().mean()
if hvd.rank() == 0:
    print(f"val loss {val_loss.avg.item():.4f} acc {accuracy.item():.4f} "
          f"over {len(all_preds)} samples", flush=True)

final = sum(p.sum().item() for p in model.parameters() if p.requires_grad)
print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)
