"""Horovod semantics the rewriter's native helpers must keep; run on 2 ranks under torchrun.

The test rewrites this file with the migrate tool and runs the result natively (and, once the
hvd shim is importable, runs this original too).  Every check asserts; exit 0 means all held.
Expected values are Horovod's (docs/horovod_torch_api.md).
"""
import torch

import horovod.torch as hvd

hvd.init()
rank = hvd.rank()
assert hvd.size() == 2

# Integer Average truncates: [3,4] on rank 0 and [6,8] on rank 1 give [4,6].
ints = torch.tensor([3, 4]) if rank == 0 else torch.tensor([6, 8])
assert hvd.allreduce(ints).tolist() == [4, 6]
assert ints.tolist() == ([3, 4] if rank == 0 else [6, 8])  # a new tensor; input untouched
assert hvd.allreduce(ints, op=hvd.Sum).tolist() == [9, 12]
assert hvd.allreduce(ints, average=False).tolist() == [9, 12]
assert hvd.allreduce(ints, op=hvd.Max, name="max").tolist() == ([6, 8])
hvd.allreduce_(ints)
assert ints.tolist() == [4, 6]  # in place

# Float average, and the gradient of an averaged allreduce is the averaged gradient.
w = torch.tensor([1.0 + rank], requires_grad=True)
avg = hvd.allreduce(w * 2.0)
assert avg.item() == 3.0
avg.backward()
assert w.grad.item() == 2.0

# Broadcast helpers.
start = hvd.broadcast_object({"epoch": 5 + rank}, root_rank=0)
assert start == {"epoch": 5}
everyone = hvd.allgather_object(rank * 10)
assert everyone == [0, 10]
t = hvd.broadcast(torch.full((3,), float(rank)), 1)
assert t.tolist() == [1.0, 1.0, 1.0]

torch.manual_seed(rank)
model = torch.nn.Linear(3, 2)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
torch.manual_seed(0)
assert torch.equal(model.weight, torch.nn.Linear(3, 2).weight)

# broadcast_optimizer_state on a fresh Adam takes Horovod's zero-gradient step first.
opt = torch.optim.Adam(model.parameters(), lr=0.1 * (rank + 1))
hvd.broadcast_optimizer_state(opt, root_rank=0)
state = opt.state[model.weight]
assert float(state["step"]) == 1.0 and torch.count_nonzero(state["exp_avg"]) == 0
assert opt.param_groups[0]["lr"] == 0.1  # options come from rank 0 too
print(f"rank {rank}: helpers ok", flush=True)
