"""Style: mixed-precision loop with torch.autocast("cpu", dtype=torch.bfloat16) and a hand-rolled GradScaler-like loss scaler.

The scaler multiplies the loss, then after optimizer.synchronize() unscales the
averaged gradients, checks for infs and steps under skip_synchronize().
"""
import torch
import torch.nn as nn

from horovod import torch as hvd


class ManualLossScaler:
    """Minimal dynamic loss scaler (what people write when they cannot use cuda.amp)."""

    def __init__(self, init_scale=2.0 ** 8, growth_interval=3):
        self.scale = init_scale
        self.growth_interval = growth_interval
        self._good_steps = 0

    def scale_loss(self, loss):
        return loss * self.scale

    def unscale_and_check(self, params):
        found_inf = False
        inv = 1.0 / self.scale
        for p in params:
            if p.grad is None:
                continue
            p.grad.mul_(inv)
            if not torch.isfinite(p.grad).all():
                found_inf = True
        return found_inf

    def update(self, found_inf):
        if found_inf:
            self.scale *= 0.5
            self._good_steps = 0
        else:
            self._good_steps += 1
            if self._good_steps % self.growth_interval == 0:
                self.scale *= 2.0


def make_model():
    return nn.Sequential(
        nn.Linear(12, 32),
        nn.GELU(),
        nn.Linear(32, 32),
        nn.GELU(),
        nn.Linear(32, 1),
    )


def main():
    hvd.init()
    torch.manual_seed(7)
    torch.set_num_threads(1)

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2 * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         op=hvd.Average)

    scaler = ManualLossScaler()
    gen = torch.Generator().manual_seed(100 + hvd.rank())
    w_true = torch.randn(12, 1, generator=torch.Generator().manual_seed(5))
    loss_fn = nn.MSELoss()

    for step in range(1, 7):
        x = torch.randn(16, 12, generator=gen)
        y = x @ w_true + 0.1 * torch.randn(16, 1, generator=gen)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(x)
        loss = loss_fn(pred.float(), y)
        scaler.scale_loss(loss).backward()
        optimizer.synchronize()
        found_inf = scaler.unscale_and_check(model.parameters())
        if not found_inf:
            with optimizer.skip_synchronize():
                optimizer.step()
        scaler.update(found_inf)
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    total = 0.0
    for p in model.parameters():
        total += p.detach().double().sum().item()
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
