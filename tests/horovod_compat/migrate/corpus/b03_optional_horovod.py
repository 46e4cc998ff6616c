"""Optional-dependency style found in libraries that "also support Horovod":
a guarded import, HAVE_HVD flag, and rank/size helpers that fall back to 0/1.
"""
import argparse
import logging
import os
import tempfile

import torch
import torch.nn as nn

try:
    import horovod.torch as hvd
    HAVE_HVD = True
except ImportError:  # pragma: no cover - horovod is optional
    hvd = None
    HAVE_HVD = False

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- #
# distributed helpers
# --------------------------------------------------------------------------- #
def dist_init():
    if HAVE_HVD:
        hvd.init()


def get_rank() -> int:
    if HAVE_HVD:
        return hvd.rank()
    return 0


def get_world_size() -> int:
    if HAVE_HVD:
        return hvd.size()
    return 1


def is_master() -> bool:
    return get_rank() == 0


def all_reduce_mean(value: float) -> float:
    if not HAVE_HVD or get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    return hvd.allreduce(t, name="all_reduce_mean").item()


def wrap_optimizer(optimizer, model):
    if HAVE_HVD and get_world_size() > 1:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            backward_passes_per_step=1)
    return optimizer


# --------------------------------------------------------------------------- #
class AutoEncoder(nn.Module):
    def __init__(self, dim=16, bottleneck=4):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, bottleneck))
        self.dec = nn.Sequential(nn.Linear(bottleneck, 32), nn.ReLU(), nn.Linear(32, dim))

    def forward(self, x):
        return self.dec(self.enc(x))


def build_dataset(rank, n=160, dim=16):
    g = torch.Generator().manual_seed(2024 + 17 * rank)
    basis = torch.randn(4, dim, generator=torch.Generator().manual_seed(2024))
    codes = torch.randn(n, 4, generator=g)
    return codes @ basis + 0.05 * torch.randn(n, dim, generator=g)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--out", default=os.environ.get("CORPUS_TMP", tempfile.gettempdir()))
    return ap.parse_args()


def main():
    args = parse()
    torch.set_num_threads(1)
    dist_init()
    logging.basicConfig(level=logging.INFO if is_master() else logging.ERROR)
    log.info("horovod available: %s, world size %d", HAVE_HVD, get_world_size())

    torch.manual_seed(0)
    data = build_dataset(get_rank())
    model = AutoEncoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * get_world_size() ** 0.5)
    optimizer = wrap_optimizer(optimizer, model)
    loss_fn = nn.MSELoss()

    n = data.shape[0]
    for step in range(args.steps):
        lo = (step * args.bs) % n
        batch = data[lo:lo + args.bs]
        optimizer.zero_grad()
        recon = model(batch)
        loss = loss_fn(recon, batch)
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={get_rank()} step={step + 1} loss={loss.item():.6f}", flush=True)
        if (step + 1) % 5 == 0:
            mean_loss = all_reduce_mean(loss.item())
            if is_master():
                log.info("step %d mean loss %.5f", step + 1, mean_loss)

    if is_master():
        torch.save(model.state_dict(), os.path.join(args.out, "b03_autoencoder.pt"))

    s = 0.0
    for p in model.parameters():
        s += p.double().sum().item()
    print(f"CORPUS rank={get_rank()} final={s:.6f}", flush=True)


if __name__ == "__main__":
    main()
