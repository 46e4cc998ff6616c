"""An unchanged Horovod-style training script trains on 2 ranks (its loss falls) and ends with the same
weights as a native DDP run of the same model, data and seed.  Both scripts run as files through the
project's engine (``distributor.run_script``), exactly as a user would launch them."""
from __future__ import annotations

import textwrap

import torch

from distributor import run_script

COMMON = '''
import sys
import torch

def make_data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(512, 10, generator=g)
    w = torch.randn(10, 1, generator=g)
    y = torch.tanh(x @ w) + 0.01 * torch.randn(512, 1, generator=g)
    return x, y

def make_model():
    torch.manual_seed(42)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
'''

HOROVOD_SCRIPT = COMMON + '''
import horovod.torch as hvd

hvd.init()
torch.set_num_threads(1)
x, y = make_data()
model = make_model()
if hvd.rank() != 0:  # different start on the other rank: broadcast_parameters must fix it
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.none, op=hvd.Average)
losses = []
for epoch in range(3):
    for start in range(0, 512, 64):
        xb = x[start:start + 64][hvd.rank()::hvd.size()]
        yb = y[start:start + 64][hvd.rank()::hvd.size()]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
if hvd.rank() == 0:
    torch.save({"losses": losses, "state": model.state_dict()}, sys.argv[1])
'''

DDP_SCRIPT = COMMON + '''
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.set_num_threads(1)
rank, size = dist.get_rank(), dist.get_world_size()
x, y = make_data()
model = DDP(make_model())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * size, momentum=0.9)
for epoch in range(3):
    for start in range(0, 512, 64):
        xb = x[start:start + 64][rank::size]
        yb = y[start:start + 64][rank::size]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
if rank == 0:
    torch.save({"state": model.module.state_dict()}, sys.argv[1])
dist.destroy_process_group()
'''


def test_horovod_script_trains_and_matches_ddp(tmp_path):
    hvd_script, ddp_script = tmp_path / "train_horovod.py", tmp_path / "train_ddp.py"
    hvd_script.write_text(textwrap.dedent(HOROVOD_SCRIPT))
    ddp_script.write_text(textwrap.dedent(DDP_SCRIPT))
    hvd_out, ddp_out = tmp_path / "hvd.pt", tmp_path / "ddp.pt"
    run_script(str(hvd_script), [str(hvd_out)], num_processes=2, timeout=300)
    run_script(str(ddp_script), [str(ddp_out)], num_processes=2, timeout=300)
    h = torch.load(hvd_out)
    d = torch.load(ddp_out)
    losses = h["losses"]
    assert len(losses) == 24
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4, losses
    assert h["state"].keys() == d["state"].keys()
    for k in h["state"]:
        assert torch.allclose(h["state"][k], d["state"][k], atol=1e-5, rtol=1e-4), k
