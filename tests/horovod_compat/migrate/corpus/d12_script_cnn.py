"""Notebook-exported style script: everything at module level, a tiny CNN on random
1x8x8 'digits', chatty f-string logging with the rank, explicit hvd.shutdown() at the end."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(0)

print(f"[{hvd.rank()}] {'starting'} on {hvd.size()} procs (local {hvd.local_rank()}/{hvd.local_size()})",
      flush=True)

NUM_CLASSES = 4
EPOCHS = 3
BS = 16

# --- data: class-specific 8x8 templates + noise --------------------------------
templates = torch.randn(NUM_CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(42))
g = torch.Generator().manual_seed(4242 + hvd.rank())
labels = torch.randint(0, NUM_CLASSES, (96,), generator=g)
images = templates[labels] + 0.7 * torch.randn(96, 1, 8, 8, generator=g)
stats = {'mean': images.mean().item(), 'std': images.std().item()}
images = (images - stats['mean']) / stats['std']
print(f"[{hvd.rank()}] data mean={stats['mean']:.3f} std={stats['std']:.3f} n={len(labels)}", flush=True)

# --- model -------------------------------------------------------------------------
net = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
    nn.MaxPool2d(2),                          # -> 16x4x4
    nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    nn.Linear(16, NUM_CLASSES),
)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
opt = torch.optim.SGD(net.parameters(), lr=0.02 * hvd.size(), momentum=0.9)
opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())

# --- train -------------------------------------------------------------------------
gstep = 0
for epoch in range(EPOCHS):
    order = torch.randperm(len(labels), generator=g)
    correct = 0
    for i in range(0, len(labels), BS):
        idx = order[i:i + BS]
        xb, yb = images[idx], labels[idx]
        opt.zero_grad()
        logits = net(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        opt.step()
        correct += (logits.argmax(1) == yb).sum().item()
        print(f"CORPUS rank={hvd.rank()} step={gstep} loss={loss.item():.6f}", flush=True)
        gstep += 1
    acc = hvd.allreduce(torch.tensor(correct / len(labels)), name=f"acc_{epoch}").item()
    if hvd.rank() == 0:
        print(f"[{hvd.rank()}] epoch {epoch}: {'acc'}={acc:.3f} {'(improving)' if acc > 0.5 else ''}",
              flush=True)

total = sum(p.detach().double().sum() for p in net.parameters()).item()
print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)
print(f"[{hvd.rank()}] {'done'}", flush=True)
hvd.shutdown()
