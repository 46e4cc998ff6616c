"""Regression job with a shared hard-example replay buffer, in the style of internal
research code: config broadcast as a Python object from rank 0, per-rank timing dicts
gathered with allgather_object, and ragged per-rank tensors gathered with allgather."""
import json
import socket
import time
from collections import defaultdict

import torch
import torch.nn as nn
import horovod.torch as hvd


def default_config():
    return {
        "run_name": "replay-mlp",
        "lr": 3e-3,
        "steps": 16,
        "batch": 16,
        "mine_every": 4,
        "replay_max": 64,
        "hidden": [40, 40],
        "seed": 123,
    }


def build_mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.Softplus()]
    return nn.Sequential(*layers[:-1])


def target_fn(x):
    return (x[:, 0] * x[:, 1] - torch.cos(2 * x[:, 2]) + 0.3 * x[:, 3:].sum(1)).unsqueeze(1)


class Timer:
    def __init__(self):
        self.acc = defaultdict(float)

    def __call__(self, key):
        timer = self

        class _Ctx:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                timer.acc[key] += time.perf_counter() - self.t
        return _Ctx()


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()

    cfg = default_config() if rank == 0 else {}
    cfg = hvd.broadcast_object(cfg, root_rank=0, name="run_config")
    assert cfg["run_name"] == "replay-mlp"

    torch.manual_seed(cfg["seed"])
    model = build_mlp([6] + cfg["hidden"] + [1])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=cfg["lr"]),
                                   named_parameters=model.named_parameters())
    mse = nn.MSELoss(reduction="none")

    gen = torch.Generator().manual_seed(cfg["seed"] + 7 * rank)
    replay_x = torch.zeros(0, 6)
    replay_y = torch.zeros(0, 1)
    n_mine = 3 + 2 * rank          # ragged: each worker contributes a different number of rows
    timer = Timer()

    for step in range(cfg["steps"]):
        with timer("data"):
            x = torch.randn(cfg["batch"], 6, generator=gen)
            y = target_fn(x) + 0.05 * torch.randn(cfg["batch"], 1, generator=gen)
            if replay_x.shape[0]:
                x_all = torch.cat([x, replay_x])
                y_all = torch.cat([y, replay_y])
            else:
                x_all, y_all = x, y
        with timer("fwd_bwd"):
            opt.zero_grad()
            per_sample = mse(model(x_all), y_all).squeeze(1)
            loss = per_sample.mean()
            loss.backward()
            opt.step()
        print(f"CORPUS rank={rank} step={step} loss={loss.item():.6f}", flush=True)

        if (step + 1) % cfg["mine_every"] == 0:
            with timer("mining"):
                hard = per_sample[: cfg["batch"]].detach().topk(n_mine).indices
                gx = hvd.allgather(x[hard], name=f"mine_x_{step}")
                gy = hvd.allgather(y[hard], name=f"mine_y_{step}")
                replay_x = torch.cat([replay_x, gx])[-cfg["replay_max"]:]
                replay_y = torch.cat([replay_y, gy])[-cfg["replay_max"]:]
            if rank == 0:
                print(f"step {step}: gathered {gx.shape[0]} hard rows, replay size {replay_x.shape[0]}",
                      flush=True)

    stats = {"rank": rank, "host": socket.gethostname(),
             "timings_ms": {k: round(v * 1e3, 2) for k, v in timer.acc.items()}}
    all_stats = hvd.allgather_object(stats, name="timings")
    assert len(all_stats) == world
    if rank == 0:
        for s in all_stats:
            print("timing " + json.dumps(s, sort_keys=True), flush=True)

    final = torch.tensor(0.0, dtype=torch.float64)
    for p in model.parameters():
        final = final + p.detach().double().sum()
    print(f"CORPUS rank={rank} final={final.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
