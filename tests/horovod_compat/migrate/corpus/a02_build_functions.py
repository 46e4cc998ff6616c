"""Config-function style (build_model / build_optimizer / train_one_epoch helpers spread across
a script), with torch DataLoader + DistributedSampler sharding the data per Horovod rank."""
import argparse
import logging
from types import SimpleNamespace

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import horovod.torch as hvd

log = logging.getLogger(__name__)

STEP = 0  # global step counter, module level like a lot of old scripts do


def get_cfg(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="mlp", choices=["mlp", "mlp_bn"])
    parser.add_argument("--hidden", type=int, default=48)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--optim", default="sgd")
    parser.add_argument("--bs", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    return SimpleNamespace(**vars(args))


def build_dataset(seed=0, n=160):
    g = torch.Generator()
    g.manual_seed(seed)
    X = torch.rand(n, 12, generator=g) * 2 - 1
    true_w = torch.linspace(-1, 1, 12).unsqueeze(1)
    Y = X @ true_w + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(X, Y)


def build_model(cfg):
    layers = [nn.Linear(12, cfg.hidden)]
    if cfg.arch == "mlp_bn":
        layers.append(nn.BatchNorm1d(cfg.hidden))
    layers += [nn.Tanh(), nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, 1)]
    return nn.Sequential(*layers)


def build_optimizer(model, cfg):
    lr = cfg.lr * hvd.size()
    if cfg.optim == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.momentum)
    elif cfg.optim == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr / 10)
    else:
        raise ValueError(cfg.optim)
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())


def train_one_epoch(model, loader, optimizer, epoch):
    global STEP
    model.train()
    crit = nn.MSELoss()
    running = 0.0
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        output = model(data)
        loss = crit(output, target)
        loss.backward()
        optimizer.step()
        STEP += 1
        print("CORPUS rank={} step={} loss={:.6f}".format(hvd.rank(), STEP, loss.item()), flush=True)
        running += loss.item()
        if batch_idx % 2 == 0 and hvd.rank() == 0:
            log.info("Train Epoch: %d [%d/%d]\tLoss: %.6f", epoch, batch_idx * len(data),
                     len(loader.sampler), loss.item())
    return running / len(loader)


def main(cfg):
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)

    train_ds = build_dataset(seed=cfg.seed)
    train_sampler = DistributedSampler(train_ds, num_replicas=hvd.size(), rank=hvd.rank(),
                                       shuffle=True, seed=cfg.seed)
    train_loader = DataLoader(train_ds, batch_size=cfg.bs, sampler=train_sampler, num_workers=0)

    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg)

    # make sure every worker starts from the same weights
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(1, cfg.epochs + 1):
        train_sampler.set_epoch(epoch)
        avg = train_one_epoch(model, train_loader, optimizer, epoch)
        if hvd.rank() == 0:
            log.info("epoch %d done, avg loss (rank 0 only) %.4f", epoch, avg)

    checksum = 0.0
    for p in model.parameters():
        checksum += p.double().sum().item()
    print("CORPUS rank={} final={:.6f}".format(hvd.rank(), checksum), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main(get_cfg())
