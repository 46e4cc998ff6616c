import torch
import horovod.torch as hvd
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

hvd.init()
dataset = TensorDataset(torch.arange(100.0))
sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
shuffled = torch.utils.data.distributed.DistributedSampler(
    dataset,
    num_replicas=hvd.size(),
    rank=hvd.rank(),
    shuffle=True,
)
half = DistributedSampler(dataset, num_replicas=hvd.size() // 2, rank=hvd.rank() // 2)
loader = DataLoader(dataset, batch_size=10, sampler=sampler)
