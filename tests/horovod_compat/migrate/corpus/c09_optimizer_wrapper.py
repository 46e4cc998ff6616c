"""Denoising conv autoencoder trained through a home-grown OptimizerWrapper (composition, no subclass),
with a Goyal-et-al. LambdaLR warmup from lr to lr*hvd.size(). Imitates imaging/lab codebases.
"""
import argparse
import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd


@dataclass
class TrainConfig:
    base_lr: float = 1e-3
    warmup_steps: int = 5
    total_steps: int = 12
    batch_size: int = 8
    img: int = 12
    noise_std: float = 0.3
    seed: int = 2718
    betas: List[float] = field(default_factory=lambda: [0.9, 0.99])


class DAE(nn.Module):
    def __init__(self, ch=8):
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(1, ch, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.dec = nn.Sequential(
            nn.ConvTranspose2d(2 * ch, ch, 4, stride=2, padding=1), nn.ReLU(),
            nn.ConvTranspose2d(ch, 1, 4, stride=2, padding=1),
        )

    def forward(self, x):
        return self.dec(self.enc(x))


class OptimizerWrapper:
    """Keeps the distributed optimizer plus some bookkeeping the rest of the code relies on."""

    def __init__(self, model: nn.Module, cfg: TrainConfig):
        base = torch.optim.Adam(model.parameters(), lr=cfg.base_lr * hvd.size(),
                                betas=tuple(cfg.betas))
        self.opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
        self.num_steps = 0

    @property
    def param_groups(self):
        return self.opt.param_groups

    def current_lr(self) -> float:
        return self.opt.param_groups[0]["lr"]

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        self.opt.step()
        self.num_steps += 1

    def state_dict(self) -> Dict:
        return {"opt": self.opt.state_dict(), "num_steps": self.num_steps}

    def load_state_dict(self, sd: Dict):
        self.opt.load_state_dict(sd["opt"])
        self.num_steps = sd["num_steps"]


def make_warmup(cfg: TrainConfig):
    size = hvd.size()

    def fn(step):
        # start at base_lr, ramp linearly to base_lr * size
        if step < cfg.warmup_steps:
            return (1.0 + step * (size - 1) / cfg.warmup_steps) / size
        return 1.0

    return fn


def synth_images(n, cfg: TrainConfig, g: torch.Generator):
    # blobs at random positions
    yy, xx = torch.meshgrid(torch.arange(cfg.img).float(), torch.arange(cfg.img).float(),
                            indexing="ij")
    cy = torch.rand(n, 1, 1, generator=g) * cfg.img
    cx = torch.rand(n, 1, 1, generator=g) * cfg.img
    r = 1.5 + 2.0 * torch.rand(n, 1, 1, generator=g)
    clean = torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r ** 2))
    return clean.unsqueeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--resume", default="", help="checkpoint to resume from")
    ap.add_argument("--total-steps", type=int, default=None)
    cli = ap.parse_args()
    cfg = TrainConfig()
    if cli.total_steps:
        cfg.total_steps = cli.total_steps

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(cfg.seed)

    model = DAE()
    optim = OptimizerWrapper(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optim.opt, lr_lambda=make_warmup(cfg))

    if cli.resume and os.path.exists(cli.resume):
        ckpt = torch.load(cli.resume, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        scheduler.load_state_dict(ckpt["sched"])

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optim.opt, root_rank=0)

    g = torch.Generator().manual_seed(cfg.seed + 1 + hvd.rank())
    while optim.num_steps < cfg.total_steps:
        clean = synth_images(cfg.batch_size, cfg, g)
        noisy = clean + cfg.noise_std * torch.randn(clean.shape, generator=g)
        optim.zero_grad()
        recon = model(noisy)
        loss = F.mse_loss(recon, clean)
        loss.backward()
        optim.step()
        scheduler.step()
        print(f"CORPUS rank={hvd.rank()} step={optim.num_steps} loss={loss.item():.6f}", flush=True)
        if hvd.rank() == 0 and optim.num_steps % 4 == 0:
            print(f"  step {optim.num_steps}: lr={optim.current_lr():.2e}")

    if hvd.rank() == 0:
        path = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "c09_dae.ckpt")
        torch.save({"model": model.state_dict(), "optim": optim.state_dict(),
                    "sched": scheduler.state_dict()}, path)

    acc = 0.0
    for name, p in model.named_parameters():
        acc += p.detach().double().sum().item()
    print(f"CORPUS rank={hvd.rank()} final={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
