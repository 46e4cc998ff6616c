"""Lifecycle and topology queries."""
import horovod.torch as hvd
import torch

hvd.init()  # one process per GPU
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())

print("rank %d of %d" % (hvd.rank(), hvd.size()))
print(hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
nodes_per_gpu = 8 / hvd.cross_size()
assert hvd.is_initialized()
if hvd.nccl_built() and hvd.gloo_built() and not hvd.ddl_built():
    print("both backends")
hvd.shutdown()
