import math

import torch
import horovod.torch as hvd


def train(loader, args):
    hvd.init()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=args.passes)
    for data, target in loader:
        optimizer.zero_grad()
        for i in range(0, len(data), args.sub_batch):
            output = model(data[i:i + args.sub_batch])
            loss = torch.nn.functional.mse_loss(output, target[i:i + args.sub_batch])
            loss.div_(math.ceil(len(data) / args.sub_batch))
            loss.backward()
        print("sub-batches done")
        optimizer.step()


def step_inside_the_inner_loop(loader, args):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=args.passes)
    for data, target in loader:
        for i in range(0, len(data), args.sub_batch):
            model(data[i:i + args.sub_batch]).sum().backward()
            optimizer.step()
