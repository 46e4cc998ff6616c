import torch
import horovod.torch as hvd


def accumulate():
    hvd.init()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=4)
    return model, opt


def passes_model_around(evaluate):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    evaluate(model)


def adasum():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Adasum)


def no_named_parameters(model):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    return opt


def clips_without_synchronize(x):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    model(x).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def wrapped_inside_a_loop(x):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        model(x).sum().backward()
        if epoch == 0:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        opt.step()


def moved_after_the_wrap(x):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    model.cuda()
    model(x.cuda()).sum().backward()
