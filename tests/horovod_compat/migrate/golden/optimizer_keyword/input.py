import torch
import horovod.torch as hvd


def main(x):
    hvd.init()
    model = torch.nn.Linear(4, 2)
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    # the wrapped optimizer passed by keyword, as Horovod's signature allows
    opt = hvd.DistributedOptimizer(optimizer=base, named_parameters=model.named_parameters())
    model(x).sum().backward()
    opt.step()
