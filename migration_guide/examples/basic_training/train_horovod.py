"""Worked example: a typical Horovod PyTorch training script.

train_horovod.py is the Horovod original; train_ddp.py is what `horovod-compat-migrate` makes of
it (the tests check that, and that both print the same losses).  Run either with:
    python -m torch.distributed.run --standalone --nproc_per_node=2 <file>
Rank 0 prints one line per step: the local loss and the loss averaged over all ranks.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import horovod.torch as hvd


def make_data():
    # The same synthetic data set on every rank; the sampler gives each rank its share.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def main():
    hvd.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())

    # Different initial weights per rank on purpose: the broadcast from rank 0 must fix that.
    torch.manual_seed(1234 + hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    dataset = make_data()
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    # Horovod recipe: scale the learning rate by the number of workers.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            avg_loss = hvd.allreduce(loss.detach(), name="avg_loss")
            if hvd.rank() == 0:
                print(f"step {step} loss {loss.item():.6f} avg {avg_loss.item():.6f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
