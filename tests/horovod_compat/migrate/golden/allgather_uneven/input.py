"""Rows per rank differ: predictions of an evaluation loop, gathered for a metric."""
import torch
import horovod.torch as hvd

hvd.init()
preds = torch.arange(hvd.rank() + 2, dtype=torch.float32)
everything = hvd.allgather(preds, name="preds")
labels = hvd.allgather(torch.ones(hvd.rank() + 1, 3, dtype=torch.int64))
weights = torch.ones(hvd.rank() + 1, 2, requires_grad=True)
hvd.allgather(weights).pow(2).sum().backward()
print(f"rank {hvd.rank()} all {everything.tolist()} labels {labels.sum().item()} grad {weights.grad.tolist()}")
