import torch
import horovod.torch as hvd


def train(loader, width):
    model = torch.nn.Linear(width, 1)
    hvd.init()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=4)
    for epoch in range(2):
        for i, (x, y) in enumerate(loader):
            out = model(x)  # forward
            loss = torch.nn.functional.mse_loss(out, y) / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
        with torch.no_grad():
            print(model(x).sum())


def zero_grad_every_pass(loader, width):
    model = torch.nn.Linear(width, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=2)
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        model(x).sum().backward()
        if (i + 1) % 2 == 0:
            optimizer.step()


def other_condition(loader, width):
    model = torch.nn.Linear(width, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=2)
    for step, (x, y) in enumerate(loader):
        model(x).sum().backward()
        if step % 3 == 0:
            optimizer.step()
            optimizer.zero_grad()
