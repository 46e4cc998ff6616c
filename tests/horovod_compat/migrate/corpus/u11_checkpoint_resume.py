"""Style: checkpoint save on rank 0 and resume -- lr scaled by hvd.size(),
train a few steps, save on rank 0, rebuild, load on rank 0 only, then
broadcast_parameters / broadcast_optimizer_state from root 0."""
import os
import tempfile

import torch
import torch.nn as nn

import horovod.torch as hvd

BASE_LR = 0.01
CKPT_DIR = os.environ.get("CORPUS_TMP", tempfile.gettempdir())


def build():
    model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LR * hvd.size())
    return model, optimizer


def train_steps(model, optimizer, batches, first_step):
    for step, (x, y) in enumerate(batches, first_step):
        optimizer.zero_grad()
        loss = nn.functional.l1_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)


hvd.init()
torch.manual_seed(hvd.rank())  # deliberately different; broadcast syncs
ckpt_path = os.path.join(CKPT_DIR, "u11_checkpoint.pt")

g = torch.Generator().manual_seed(300 + hvd.rank())
xs = torch.randn(8, 6, 5, generator=g)
batches = [(x, x.sum(dim=1, keepdim=True).tanh()) for x in xs]

# --- first run: train 4 steps and checkpoint on rank 0 ---
model, optimizer = build()
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
train_steps(model, optimizer, batches[:4], 1)
if hvd.rank() == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": 4}, ckpt_path)
hvd.allreduce(torch.tensor(0.0), name="ckpt_barrier")

# --- resume: fresh objects, load on rank 0, broadcast to the rest ---
model, optimizer = build()
resume_step = 0
if hvd.rank() == 0:
    state = torch.load(ckpt_path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    resume_step = state["step"]
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
resume_step = int(hvd.broadcast(torch.tensor(resume_step), root_rank=0,
                                name="resume_step").item())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
train_steps(model, optimizer, batches[resume_step:], resume_step + 1)

final = sum(p.detach().sum().item() for p in model.parameters() if p.requires_grad)
print(f"CORPUS rank={hvd.rank()} final={final:.6f}", flush=True)
