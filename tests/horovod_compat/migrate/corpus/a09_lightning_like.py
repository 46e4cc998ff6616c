"""Home-grown "Lightning-like" mini framework seen in research codebases: a LitModel with
training_step()/configure_optimizers() and a Fit loop class that owns the Horovod plumbing."""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

_log = logging.getLogger("minilit")


# ----------------------------------------------------------------------------- framework
@dataclass
class FitConfig:
    max_epochs: int = 3
    log_every_n_steps: int = 4
    gradient_clip_val: Optional[float] = None
    seed: int = 123
    callbacks: List[Any] = field(default_factory=list)


class LitModule(nn.Module):
    """base class; subclasses implement training_step and configure_optimizers"""

    def training_step(self, batch, batch_idx: int) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def configure_optimizers(self):
        raise NotImplementedError

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        pass


class Fit:
    def __init__(self, cfg: FitConfig):
        self.cfg = cfg
        self.global_step = 0
        self.optimizer = None
        self.lr_scheduler = None
        if not hvd.is_initialized():
            hvd.init()
        self.rank = hvd.rank()
        self.world_size = hvd.size()

    # optimizers may come back as opt, [opt], ([opt], [sched]) or {"optimizer":..,"lr_scheduler":..}
    def _unpack_optimizers(self, out) -> Tuple[torch.optim.Optimizer, Any]:
        if isinstance(out, dict):
            return out["optimizer"], out.get("lr_scheduler")
        if isinstance(out, (list, tuple)):
            if len(out) == 2 and isinstance(out[0], (list, tuple)):
                return out[0][0], (out[1][0] if out[1] else None)
            return out[0], None
        return out, None

    def setup(self, module: LitModule):
        opt, sched = self._unpack_optimizers(module.configure_optimizers())
        # wrap with horovod; the module doesn't need to know
        self.optimizer = hvd.DistributedOptimizer(opt, named_parameters=module.named_parameters())
        # NB: the wrapper shares param_groups with `opt`, so the scheduler (built on the raw
        # optimizer) still drives the lr of the wrapped one. torch warns about step order once.
        self.lr_scheduler = sched
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def fit(self, module: LitModule, train_dataloader: Iterable):
        self.setup(module)
        for epoch in range(self.cfg.max_epochs):
            module.train()
            losses = []
            for batch_idx, batch in enumerate(train_dataloader):
                out = module.training_step(batch, batch_idx)
                loss = out["loss"] if isinstance(out, dict) else out
                self.optimizer.zero_grad()
                loss.backward()
                if self.cfg.gradient_clip_val:
                    self.optimizer.synchronize()
                    nn.utils.clip_grad_norm_(module.parameters(), self.cfg.gradient_clip_val)
                    with self.optimizer.skip_synchronize():
                        self.optimizer.step()
                else:
                    self.optimizer.step()
                self.global_step += 1
                print(f"CORPUS rank={self.rank} step={self.global_step} loss={loss.item():.6f}",
                      flush=True)
                losses.append(loss.detach())
                if self.rank == 0 and self.global_step % self.cfg.log_every_n_steps == 0:
                    _log.info("epoch=%d step=%d loss=%.4f", epoch, self.global_step, loss.item())
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            epoch_loss = hvd.allreduce(torch.stack(losses).mean(), name="epoch_loss").item()
            module.on_epoch_end(epoch, {"train_loss": epoch_loss})
        return module


# ----------------------------------------------------------------------------- user code
class LitRegressor(LitModule):
    def __init__(self, in_features=6, hidden=40, lr=1e-2):
        super().__init__()
        self.save_hparams = dict(in_features=in_features, hidden=hidden, lr=lr)
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.SiLU(),
                                 nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, 2))
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        y_hat = self(x)
        loss = F.smooth_l1_loss(y_hat, y)
        return {"loss": loss, "log": {"train_loss": loss.detach()}}

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.lr * hvd.size())
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        return [opt], [sched]

    def on_epoch_end(self, epoch, logs):
        if hvd.rank() == 0:
            _log.info("epoch %d train_loss(avg over ranks)=%.5f", epoch, logs["train_loss"])


def make_loader(rank: int, n_batches=5, bs=20, seed=0):
    g = torch.Generator().manual_seed(seed + 31 * rank)
    W = torch.randn(6, 2, generator=torch.Generator().manual_seed(seed))
    batches = []
    for _ in range(n_batches):
        x = torch.randn(bs, 6, generator=g)
        batches.append((x, torch.sin(x @ W)))
    return batches


def cli():
    p = argparse.ArgumentParser()
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=123)
    return p.parse_args()


if __name__ == "__main__":
    a = cli()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(name)s | %(message)s")
    trainer = Fit(FitConfig(max_epochs=a.max_epochs, gradient_clip_val=a.clip, seed=a.seed))
    torch.manual_seed(a.seed)
    model = LitRegressor()
    trainer.fit(model, make_loader(trainer.rank, seed=a.seed))
    final = sum(p.double().sum() for p in model.parameters()).item()
    print(f"CORPUS rank={trainer.rank} final={final:.6f}", flush=True)
