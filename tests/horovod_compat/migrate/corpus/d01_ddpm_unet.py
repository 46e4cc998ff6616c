"""Toy DDPM training loop in the style of small research diffusion repos
(dataclass config, linear beta schedule, EMA shadow model, AdamW under Horovod)."""
import copy
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd


@dataclass
class DiffusionConfig:
    timesteps: int = 50
    beta_start: float = 1e-4
    beta_end: float = 2e-2
    hidden: int = 48
    time_dim: int = 16
    lr: float = 2e-3
    weight_decay: float = 1e-2
    batch_size: int = 32
    train_steps: int = 24
    ema_decay: float = 0.95
    seed: int = 1234
    betas_adam: tuple = field(default_factory=lambda: (0.9, 0.99))


def sinusoidal_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None, :]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


class Denoiser(nn.Module):
    """eps-prediction MLP, stands in for the UNet."""

    def __init__(self, cfg: DiffusionConfig, data_dim=2):
        super().__init__()
        self.time_dim = cfg.time_dim
        self.t_proj = nn.Linear(cfg.time_dim, cfg.hidden)
        self.inp = nn.Linear(data_dim, cfg.hidden)
        self.mid = nn.Sequential(nn.SiLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU())
        self.out = nn.Linear(cfg.hidden, data_dim)

    def forward(self, x, t):
        h = self.inp(x) + self.t_proj(sinusoidal_embedding(t, self.time_dim))
        return self.out(self.mid(h))


class NoiseSchedule:
    def __init__(self, cfg: DiffusionConfig):
        self.T = cfg.timesteps
        self.betas = torch.linspace(cfg.beta_start, cfg.beta_end, cfg.timesteps)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)
        self.sqrt_ac = self.alphas_cumprod.sqrt()
        self.sqrt_one_minus_ac = (1.0 - self.alphas_cumprod).sqrt()

    def q_sample(self, x0, t, noise):
        return self.sqrt_ac[t][:, None] * x0 + self.sqrt_one_minus_ac[t][:, None] * noise


@torch.no_grad()
def ema_update(ema_model, model, decay):
    for p_ema, p in zip(ema_model.parameters(), model.parameters()):
        p_ema.mul_(decay).add_(p.detach(), alpha=1.0 - decay)


def two_moons(n, gen):
    theta = torch.rand(n, generator=gen) * math.pi
    which = torch.randint(0, 2, (n,), generator=gen)
    x = torch.stack([torch.cos(theta), torch.sin(theta)], 1)
    x[which == 1] = torch.stack([1 - torch.cos(theta), 0.5 - torch.sin(theta)], 1)[which == 1]
    return x + 0.05 * torch.randn(n, 2, generator=gen)


def main():
    torch.set_num_threads(1)
    cfg = DiffusionConfig()
    hvd.init()
    torch.manual_seed(cfg.seed)

    model = Denoiser(cfg)
    ema = copy.deepcopy(model).requires_grad_(False)
    sched = NoiseSchedule(cfg)

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr * hvd.size(),
                            betas=cfg.betas_adam, weight_decay=cfg.weight_decay)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_parameters(ema.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    gen = torch.Generator().manual_seed(cfg.seed + 1000 * hvd.rank())
    dataset = two_moons(cfg.batch_size * 8, gen)

    for step in range(cfg.train_steps):
        idx = torch.randint(0, dataset.shape[0], (cfg.batch_size,), generator=gen)
        x0 = dataset[idx]
        t = torch.randint(0, sched.T, (cfg.batch_size,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        xt = sched.q_sample(x0, t, noise)

        opt.zero_grad()
        loss = F.mse_loss(model(xt, t), noise)
        loss.backward()
        opt.step()
        ema_update(ema, model, cfg.ema_decay)

        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    with torch.no_grad():
        ema_norm = sum(p.double().sum() for p in ema.parameters()).item()
        total = sum(p.double().sum() for p in model.parameters()).item()
    if hvd.rank() == 0:
        print(f"ema param sum {ema_norm:.4f}", flush=True)
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
