import horovod.torch as hvd

hvd.init()
rank = hvd.rank()
sizes = hvd.allgather(torch.tensor([rank]))
