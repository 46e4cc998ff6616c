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


class Trainer:
    def __init__(self, model, compression):
        self.model = model
        self.compression = compression

    def make_optimizer(self):
        # the compressor comes from the caller: in a native file it is DDP's fp16 hook or None
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        return hvd.DistributedOptimizer(optimizer=optimizer, named_parameters=self.model.named_parameters(),
                                        compression=self.compression)


def with_a_trainer(x):
    trainer = Trainer(torch.nn.Linear(4, 2), hvd.Compression.fp16)
    opt = trainer.make_optimizer()
    trainer.model(x).sum().backward()
    opt.step()
