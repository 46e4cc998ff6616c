import torch
import horovod.torch as hvd

hvd.init()
dataset = list(range(64))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=False)
loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, 3):
        for state.batch, x in enumerate(loader):
            state.optimizer.zero_grad()
            state.model(x.float().unsqueeze(1)).sum().backward()
            state.optimizer.step()
            state.sampler.record_batch(state.batch, 8)
            state.commit()
        state.sampler.set_epoch(state.epoch + 1)


def on_reset():
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_reset])
train(state)
