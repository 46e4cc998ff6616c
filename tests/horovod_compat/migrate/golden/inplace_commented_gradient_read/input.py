import torch
import horovod.torch as hvd


def evaluate(model, x):
    with torch.no_grad():
        return model(x).sum().item()


def main(x):
    hvd.init()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for _ in range(3):
        optimizer.zero_grad()
        model(x).sum().backward()
        # torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  (a comment: not a gradient read)
        optimizer.step()
    print(evaluate(model, x))
