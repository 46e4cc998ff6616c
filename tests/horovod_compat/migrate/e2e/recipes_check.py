"""Run on 2 ranks: the guide's recipes (migration_guide/recipes.py) behave as documented."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.environ["RECIPES_DIR"])
from recipes import allgather_varsize, train_accumulating  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

# allgather of unequal first dimensions, like hvd.allgather: rank r sends r+1 rows of value r.
out = allgather_varsize(torch.full((rank + 1, 2), float(rank)))
assert out.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]], out

# backward_passes_per_step=3 on DDP == sum of 3 local gradients, averaged across ranks, per step.
def batches_of(r):
    gen = torch.Generator().manual_seed(10 + r)
    return [(torch.randn(4, 3, generator=gen), torch.randn(4, 1, generator=gen)) for _ in range(6)]

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
reference = torch.nn.Linear(3, 1)
reference.load_state_dict(model.state_dict())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train_accumulating(DDP(model), opt, batches_of(rank), F.mse_loss, passes_per_step=3)

ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
all_batches = [batches_of(r) for r in range(world)]
for start in (0, 3):
    ref_opt.zero_grad()
    for r in range(world):
        for x, y in all_batches[r][start:start + 3]:
            (F.mse_loss(reference(x), y) / world).backward()  # sum over passes, mean over ranks
    ref_opt.step()
for p, q in zip(model.parameters(), reference.parameters()):
    assert torch.allclose(p, q, atol=1e-6), (p, q)

# torch.profiler records the collectives and writes a Chrome trace (the timeline replacement).
from torch.profiler import ProfilerActivity, profile  # noqa: E402

path = os.path.join(os.environ["TRACE_DIR"], f"trace_rank{rank}.json")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    t = torch.ones(1000)
    dist.all_reduce(t)
prof.export_chrome_trace(path)
with open(path) as f:
    events = json.load(f)["traceEvents"]
assert any("all_reduce" in str(e.get("name", "")) for e in events), "no all_reduce in trace"
print(f"rank {rank}: recipes ok", flush=True)
dist.destroy_process_group()
