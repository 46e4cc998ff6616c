"""Physics-informed MLP for a damped harmonic oscillator (u'' + 2*zeta*w*u' + w^2*u = 0).

Imitates scientific-ML (PINN) scripts: autograd derivatives in a custom residual loss, and global
metrics via hvd.allreduce with Sum / Max / Min ops.
"""
import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn

import horovod.torch as hvd

torch.set_num_threads(1)

# physical constants
ZETA = 0.2
OMEGA = 3.0


def exact_solution(t):
    wd = OMEGA * np.sqrt(1 - ZETA ** 2)
    return torch.exp(-ZETA * OMEGA * t) * torch.cos(wd * t)


class PINN(nn.Module):
    def __init__(self, width=32, depth=3):
        super(PINN, self).__init__()
        layers = [nn.Linear(1, width), nn.Tanh()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.Tanh()]
        layers += [nn.Linear(width, 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, t):
        return self.net(t)


def physics_loss(model, t_col, t_data, u_data, lam_ic=10.0):
    t_col = t_col.clone().requires_grad_(True)
    u = model(t_col)
    du = torch.autograd.grad(u, t_col, torch.ones_like(u), create_graph=True)[0]
    d2u = torch.autograd.grad(du, t_col, torch.ones_like(du), create_graph=True)[0]
    residual = d2u + 2 * ZETA * OMEGA * du + OMEGA ** 2 * u
    loss_pde = (residual ** 2).mean()

    # initial condition u(0)=1, u'(0)=-zeta*omega (matches exact_solution)
    t0 = torch.zeros(1, 1, requires_grad=True)
    u0 = model(t0)
    du0 = torch.autograd.grad(u0, t0, torch.ones_like(u0), create_graph=True)[0]
    loss_ic = (u0 - 1.0).pow(2).mean() + (du0 + ZETA * OMEGA).pow(2).mean()

    loss_data = ((model(t_data) - u_data) ** 2).mean()
    return loss_pde / OMEGA ** 4 + lam_ic * loss_ic + loss_data, residual.detach()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--iters', type=int, default=12)
    parser.add_argument('--n-col', type=int, default=64, help='collocation points per rank')
    parser.add_argument('--n-data', type=int, default=8)
    parser.add_argument('--lr', type=float, default=2e-3)
    parser.add_argument('--t-max', type=float, default=2.0)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    model = PINN()

    # each rank owns a slice of the time domain
    g = torch.Generator().manual_seed(1000 + hvd.rank())
    lo = args.t_max * hvd.rank() / hvd.size()
    hi = args.t_max * (hvd.rank() + 1) / hvd.size()
    t_col = lo + (hi - lo) * torch.rand(args.n_col, 1, generator=g)
    n_data_local = args.n_data + 2 * hvd.rank()   # uneven sensor counts on purpose
    t_data = lo + (hi - lo) * torch.rand(n_data_local, 1, generator=g)
    u_data = exact_solution(t_data) + 0.01 * torch.randn(n_data_local, 1, generator=g)

    count = hvd.allreduce(torch.tensor(n_data_local), op=hvd.Sum, name='n_sensors')
    if hvd.rank() == 0:
        print('total sensors across ranks: %d' % int(count))

    opt = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    history = []
    for it in range(args.iters):
        opt.zero_grad()
        loss, res = physics_loss(model, t_col, t_data, u_data)
        loss.backward()
        opt.step()
        print('CORPUS rank=%d step=%d loss=%.6f' % (hvd.rank(), it + 1, loss.item()), flush=True)

        max_res = hvd.allreduce(res.abs().max(), op=hvd.Max, name='max_res')
        history.append(float(max_res))

    # evaluation on a common grid; each rank evaluates its part
    with torch.no_grad():
        t_eval = torch.linspace(lo, hi, 50).unsqueeze(1)
        err = (model(t_eval) - exact_solution(t_eval)).abs()
        max_err = hvd.allreduce(err.max(), op=hvd.Max, name='max_err')
        min_err = hvd.allreduce(err.min(), op=hvd.Min, name='min_err')
        n_eval = hvd.allreduce(torch.tensor([err.numel()], dtype=torch.float64), op=hvd.Sum)
        sum_err = hvd.allreduce(err.sum().double(), op=hvd.Sum)
    if hvd.rank() == 0:
        print('eval: max|err|=%.4f min|err|=%.4f mean|err|=%.4f over %d pts' % (
            max_err, min_err, (sum_err / n_eval).item(), int(n_eval.item())))
        np.save(os.path.join(os.environ.get('CORPUS_TMP', tempfile.gettempdir()),
                             'c03_res_history.npy'), np.array(history))

    s = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        s += p.double().sum()
    print('CORPUS rank=%d final=%.6f' % (hvd.rank(), s.item()), flush=True)


if __name__ == '__main__':
    main()
