"""Databricks pattern: every import inside the training function, so it pickles."""


def train_hvd(learning_rate):
    import torch
    import horovod.torch as hvd

    hvd.init()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(3, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(2):
        optimizer.zero_grad()
        loss = model(torch.ones(4, 3, device=device)).mean()
        loss.backward()
        optimizer.step()
    return loss.item()
