import torch
import horovod.torch as hvd

COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
REDUCERS = {"mean": hvd.Average, "sum": hvd.Sum}
ONLY_FP16 = {0: hvd.Compression.fp16}


def compression_from_config(cfg, x):
    hvd.init()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=COMPRESSIONS[cfg["compression"]])
    model(x).sum().backward()
    opt.step()


def op_by_literal_key(x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=REDUCERS["mean"])
    model(x).sum().backward()
    opt.step()


def sum_by_literal_key(x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=REDUCERS["sum"],
                                   compression=ONLY_FP16[0])
    model(x).sum().backward()
    opt.step()
