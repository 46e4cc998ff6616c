import torch
import horovod.torch as hvd


def named_choices(args, x):
    hvd.init()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    if args.adasum:
        op = hvd.Adasum
    else:
        op = hvd.Average
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression, op=op,
                                   gradient_predivide_factor=args.predivide)
    model(x).sum().backward()
    opt.step()


def inline_choices(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        compression=hvd.Compression.none if args.exact else (
            hvd.Compression.fp16 if args.fp16 else hvd.Compression.none),
        op=hvd.Adasum if args.use_adasum else hvd.Average)
    model(x).sum().backward()
    opt.step()


def name_used_twice(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    print(compression)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)
    model(x).sum().backward()


def sum_branch(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   op=hvd.Sum if args.sum else hvd.Average)
    model(x).sum().backward()
