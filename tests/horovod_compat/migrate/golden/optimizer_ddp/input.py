import torch
import torch.nn.functional as F
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(10, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)

# Horovod: wrap the optimizer, then sync the initial state from rank 0.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def train_step(x, y):
    model.train()
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    # clip after the gradients are averaged
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with optimizer.skip_synchronize():
        optimizer.step()
    return loss


if hvd.rank() == 0:
    torch.save(model.state_dict(), "/tmp/checkpoint.pt")
