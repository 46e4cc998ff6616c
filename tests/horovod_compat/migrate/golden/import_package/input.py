"""`import horovod.torch` without an alias, every use spelled out as horovod.torch.NAME."""
import torch
import horovod.torch


def train():
    horovod.torch.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * horovod.torch.size())
    horovod.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = horovod.torch.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for step in range(3):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        mean = horovod.torch.allreduce(loss.detach(), op=horovod.torch.Average)
        if horovod.torch.rank() == 0:
            print(step, mean.item())


if __name__ == "__main__":
    train()
