import torch
import horovod.torch as hvd


def main():
    hvd.init(process_sets="dynamic")
    halves = [hvd.add_process_set(list(range(0, hvd.size(), 2))),
              hvd.add_process_set(list(range(1, hvd.size(), 2)))]
    mine = halves[hvd.rank() % 2]
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(),
                                   compression=hvd.Compression.fp16, process_set=mine)
    head = torch.nn.Linear(4, 1)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.1)
    head_opt = hvd.DistributedOptimizer(head_opt, named_parameters=head.named_parameters(),
                                        process_set=hvd.global_process_set)
    for _ in range(3):
        opt.zero_grad()
        head_opt.zero_grad()
        (net(torch.randn(8, 4)).sum() + head(torch.randn(8, 4)).sum()).backward()
        opt.step()
        head_opt.step()
