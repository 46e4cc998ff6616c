import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     backward_passes_per_step=2)


def train(loader):
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y) / 2
        loss.backward()
        if (i + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()


def validation_loss(loader):
    # its result may be backpropagated by the caller: not an evaluation the rewriter can prove
    losses = []
    for x, y in loader:
        losses.append(torch.nn.functional.mse_loss(model(x), y))
    return torch.stack(losses).mean()
