"""Style: script with main() under `if __name__ == "__main__":`, using
hvd.local_rank(), torch.set_num_threads, hvd.broadcast_object for a config
dict, and a StepLR learning-rate scheduler."""
import os
import sys

import torch
import torch.nn as nn
import torch.optim as optim

import horovod.torch as hvd


def get_config():
    # Only rank 0 "reads" the config; everybody else receives it.
    if hvd.rank() == 0:
        return {"lr": 0.08, "gamma": 0.5, "step_size": 3, "epochs": 3, "batches": 3}
    return None


def make_model():
    return nn.Sequential(nn.Linear(7, 14), nn.LeakyReLU(0.1), nn.Linear(14, 2))


def main(argv=None):
    hvd.init()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    local_rank = hvd.local_rank()
    if local_rank == 0:
        print("node leader pid=%d" % os.getpid(), file=sys.stderr, flush=True)

    config = hvd.broadcast_object(get_config(), root_rank=0, name="config")

    torch.manual_seed(31)
    model = make_model().to(device)
    optimizer = optim.SGD(model.parameters(), lr=config["lr"], momentum=0.8)
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters())
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=config["step_size"],
                                          gamma=config["gamma"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(64 + hvd.rank())
    inputs = torch.randn(config["batches"], 10, 7, generator=gen)
    targets = torch.stack([inputs[..., 0], -inputs[..., 1]], dim=-1)

    step = 0
    for epoch in range(config["epochs"]):
        for x, y in zip(inputs, targets):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}",
                  flush=True)

    final = sum(p.detach().sum().item() for p in model.parameters() if p.requires_grad)
    print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
