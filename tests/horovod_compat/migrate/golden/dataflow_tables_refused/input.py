import torch
import horovod.torch as hvd

MUTATED = {"none": hvd.Compression.none}
MUTATED["fp16"] = hvd.Compression.fp16
COMPUTED_KEYS = {str(k): hvd.Compression.none for k in range(2)}
REDUCERS = {"mean": hvd.Average, "sum": hvd.Sum}


def mutated_table(cfg, x):
    hvd.init()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=MUTATED[cfg["compression"]])
    model(x).sum().backward()
    opt.step()


def not_a_dict_literal(cfg, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=COMPUTED_KEYS[cfg["compression"]])
    model(x).sum().backward()
    opt.step()


def op_chosen_at_run_time(cfg, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=REDUCERS[cfg["op"]])
    model(x).sum().backward()
    opt.step()


def missing_key(x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=REDUCERS["max"])
    model(x).sum().backward()
    opt.step()
