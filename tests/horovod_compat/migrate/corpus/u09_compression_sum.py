"""Style: two models trained side by side, one with
compression=hvd.Compression.fp16 and op=hvd.Sum, the other averaging with
gradient_predivide_factor."""
import torch
import torch.nn as nn

import horovod.torch as hvd


def make_model(seed, out_dim):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, out_dim))


hvd.init()
main_model = make_model(555, 2)
aux_model = make_model(556, 1)

# Summed fp16-compressed gradients, so lr is divided by the world size.
main_opt = hvd.DistributedOptimizer(
    torch.optim.SGD(main_model.parameters(), lr=0.05 / hvd.size()),
    named_parameters=main_model.named_parameters(),
    compression=hvd.Compression.fp16,
    op=hvd.Sum)

# Averaged gradients, with predivision split before/after the reduction.
aux_opt = hvd.DistributedOptimizer(
    torch.optim.SGD(aux_model.parameters(), lr=0.05),
    named_parameters=[("aux." + n, p) for n, p in aux_model.named_parameters()],
    compression=hvd.Compression.none,
    op=hvd.Average,
    gradient_predivide_factor=2.0)

for m in (main_model, aux_model):
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)

g = torch.Generator().manual_seed(99 + hvd.rank())
batches = [(x, x[:, 2:] + 1.0) for x in torch.randn(8, 10, 4, generator=g)]

for step, (x, y) in enumerate(batches, 1):
    main_opt.zero_grad()
    aux_opt.zero_grad()
    loss_main = nn.functional.mse_loss(main_model(x), y)
    loss_aux = nn.functional.mse_loss(aux_model(x), y.sum(dim=1, keepdim=True))
    loss = loss_main + loss_aux
    loss.backward()
    main_opt.step()
    aux_opt.step()
    print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

total = sum(p.detach().sum().item()
            for m in (main_model, aux_model) for p in m.parameters() if p.requires_grad)
print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)
