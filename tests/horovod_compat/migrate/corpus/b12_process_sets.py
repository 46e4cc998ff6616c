"""Small hyper-parameter sweep with Horovod process sets: even and odd ranks each
train their own config (gradients reduced inside the set), and results are
compared over the global set. Threads/device derived from local/cross rank.
"""
import argparse
import os
import socket
import tempfile

import torch
import torch.nn as nn
import horovod.torch as hvd

torch.set_num_threads(1)

CONFIGS = [
    {"name": "narrow", "width": 32, "lr": 0.05},
    {"name": "wide", "width": 64, "lr": 0.02},
]


def configure_worker():
    """Pin threads and pick a device from the local topology."""
    n_threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "1")) // hvd.local_size())
    torch.set_num_threads(n_threads)
    if torch.cuda.is_available():
        device = "cuda:%d" % hvd.local_rank()
        torch.cuda.set_device(hvd.local_rank())
    else:
        device = "cpu"
    print("host=%s node=%d local_rank=%d/%d threads=%d device=%s" % (
        socket.gethostname(), hvd.cross_rank(), hvd.local_rank(), hvd.local_size(), n_threads, device))
    return device


def make_split(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 7, generator=g)
    y = torch.tanh(x[:, :3].sum(1, keepdim=True)) - 0.3 * x[:, 3:4]
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=20)
    args = ap.parse_args()

    hvd.init(process_sets="dynamic")
    device = configure_worker()

    # every rank must take part in creating every set, in the same order
    even_ranks = list(range(0, hvd.size(), 2))
    odd_ranks = list(range(1, hvd.size(), 2))
    even_set = hvd.add_process_set(even_ranks)
    odd_set = hvd.add_process_set(odd_ranks) if odd_ranks else None

    my_set = even_set if hvd.rank() % 2 == 0 else odd_set
    my_ranks = even_ranks if hvd.rank() % 2 == 0 else odd_ranks
    cfg = CONFIGS[hvd.rank() % 2]
    leader = my_ranks[0]  # root_rank is a *global* rank even inside a set

    torch.manual_seed(1000 + hvd.rank() % 2)
    model = nn.Sequential(nn.Linear(7, cfg["width"]), nn.ReLU(), nn.Linear(cfg["width"], 1)).to(device)
    for name, p in model.state_dict().items():
        hvd.broadcast_(p, root_rank=leader, name="init." + name, process_set=my_set)

    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), process_set=my_set)

    x, y = make_split(50 + hvd.rank(), args.steps * args.batch)
    xv, yv = make_split(999, 100)  # same validation data everywhere
    x, y, xv, yv = x.to(device), y.to(device), xv.to(device), yv.to(device)
    loss_fn = nn.MSELoss()

    for step in range(1, args.steps + 1):
        sl = slice((step - 1) * args.batch, step * args.batch)
        opt.zero_grad()
        loss = loss_fn(model(x[sl]), y[sl])
        loss.backward()
        opt.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    with torch.no_grad():
        val = loss_fn(model(xv), yv).detach().cpu()
    # average inside the sweep member first, then compare across the whole job
    val = hvd.allreduce(val, name="val_in_set", process_set=my_set)
    best = hvd.allreduce(val, name="val_best", op=hvd.Min, process_set=hvd.global_process_set)
    all_vals = hvd.allgather(val.reshape(1), name="val_all")
    if hvd.rank() == 0:
        print("val losses per rank:", [round(v, 4) for v in all_vals.tolist()], "best:", round(best.item(), 4))
        out = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b12_sweep.txt")
        with open(out, "w") as fh:
            for r, v in enumerate(all_vals.tolist()):
                fh.write("%d %s %.6f\n" % (r, CONFIGS[r % 2]["name"], v))

    total = sum(p.detach().double().sum() for p in model.parameters()).item()
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)

    hvd.barrier()
    if odd_set is not None:
        hvd.remove_process_set(odd_set)
    hvd.remove_process_set(even_set)


if __name__ == "__main__":
    main()
