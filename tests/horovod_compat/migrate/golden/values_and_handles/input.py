"""Horovod constants kept as values, handles, join and process sets (rules/constants.py,
collectives.py)."""
import horovod
import torch
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError

REDUCERS = {"mean": hvd.Average, "sum": hvd.Sum, "max": hvd.Max}


def reduce_metric(t, how="mean"):
    return hvd.allreduce(t, op=REDUCERS[how], name=f"metric.{how}")


def make_optimizer(model, compression, op=hvd.Average):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    compression=compression, op=op)


def main(fp16=False):
    print("horovod", horovod.__version__)
    hvd.init()
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    evens = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    model = torch.nn.Linear(4, 1)
    opt = make_optimizer(model, compression)
    handle = hvd.allreduce_async_(torch.ones(2), op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    total = hvd.synchronize(handle)
    try:
        best = reduce_metric(total, "max")
    except HorovodInternalError:
        best = None
    if evens.included():
        hvd.barrier(process_set=evens)
    last = hvd.join()
    hvd.remove_process_set(evens)
    return opt, best, last
