import torch
import horovod.torch as hvd


class Trainer:
    def __init__(self, model, passes):
        hvd.init()
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        # configured, but every step() below follows one backward(): Horovod averaged at step()
        self.optimizer = hvd.DistributedOptimizer(self.optimizer, named_parameters=model.named_parameters(),
                                                  backward_passes_per_step=passes)

    def train(self, loader):
        for x, y in loader:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
