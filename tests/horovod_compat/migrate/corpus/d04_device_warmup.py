"""Imitates the upstream Horovod ImageNet/MNIST example scripts: module-level argparse,
local_rank() GPU pinning with a CPU fallback, broadcast after wrapping, LR warmup to lr*size."""
from __future__ import print_function

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data.distributed
import horovod.torch as hvd

parser = argparse.ArgumentParser(description='PyTorch synthetic tabular example')
parser.add_argument('--batch-size', type=int, default=16, metavar='N')
parser.add_argument('--epochs', type=int, default=3, metavar='N')
parser.add_argument('--base-lr', type=float, default=0.0125)
parser.add_argument('--warmup-epochs', type=float, default=2)
parser.add_argument('--momentum', type=float, default=0.9)
parser.add_argument('--wd', type=float, default=5e-5)
parser.add_argument('--no-cuda', action='store_true', default=False)
parser.add_argument('--seed', type=int, default=42)
parser.add_argument('--log-interval', type=int, default=4)

args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(args.seed)

if args.cuda:
    # Horovod: pin GPU to local rank.
    torch.cuda.set_device(hvd.local_rank())
    torch.cuda.manual_seed(args.seed)
    device = torch.device('cuda', hvd.local_rank())
else:
    device = torch.device('cpu')

kwargs = {'num_workers': 0, 'pin_memory': True} if args.cuda else {}

# same "dataset" on every worker, sharded by the sampler
_g = torch.Generator().manual_seed(1)
X = torch.randn(192, 20, generator=_g)
Y = ((X[:, :5].sum(1) > 0).long() + (X[:, 5:10].sum(1) > 1).long())
# rank-dependent label noise / jitter, seeded from the rank
_rg = torch.Generator().manual_seed(args.seed * 100 + hvd.rank())
X = X + 0.01 * torch.randn(X.shape, generator=_rg)

train_dataset = torch.utils.data.TensorDataset(X, Y)
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed)
train_loader = torch.utils.data.DataLoader(
    train_dataset, batch_size=args.batch_size, sampler=train_sampler, **kwargs)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(20, 48)
        self.bn = nn.BatchNorm1d(48)
        self.fc2 = nn.Linear(48, 32)
        self.drop = nn.Dropout(p=0.0)
        self.fc3 = nn.Linear(32, 3)

    def forward(self, x):
        x = F.relu(self.bn(self.fc1(x)))
        x = self.drop(F.relu(self.fc2(x)))
        return F.log_softmax(self.fc3(x), dim=1)


model = Net()
model.to(device)

optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(),
                            momentum=args.momentum, weight_decay=args.wd)

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def adjust_learning_rate(epoch, batch_idx):
    # Horovod: gradual warmup from base_lr to base_lr * size over warmup_epochs
    if epoch < args.warmup_epochs:
        epoch += float(batch_idx + 1) / len(train_loader)
        lr_adj = 1. / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
    else:
        lr_adj = 1.
    for param_group in optimizer.param_groups:
        param_group['lr'] = args.base_lr * hvd.size() * lr_adj


global_step = 0


def train(epoch):
    global global_step
    model.train()
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        adjust_learning_rate(epoch, batch_idx)
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        print('CORPUS rank={} step={} loss={:.6f}'.format(hvd.rank(), global_step, loss.item()), flush=True)
        global_step += 1
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print('Train Epoch: {} [{}/{}]\tlr: {:.5f}'.format(
                epoch, batch_idx * len(data), len(train_sampler), optimizer.param_groups[0]['lr']), flush=True)


for epoch in range(args.epochs):
    train(epoch)

with torch.no_grad():
    param_sum = sum(p.detach().cpu().double().sum().item() for p in model.parameters())
print('CORPUS rank={} final={:.6f}'.format(hvd.rank(), param_sum), flush=True)
