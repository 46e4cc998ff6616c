import torch
import horovod.torch as hvd


def main():
    hvd.init()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(net.parameters(), lr=1e-3 * hvd.size()),
        named_parameters=net.named_parameters(),
        compression=hvd.Compression.fp16,
        groups=2,
    )
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
