import torch
import horovod.torch as hvd


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def report(correct, total, loss):
    n_correct = hvd.allreduce(torch.tensor(correct), op=hvd.Sum)
    n_total = hvd.allreduce(torch.tensor(total), average=False)
    worst = hvd.allreduce(loss, op=hvd.Max, name="worst_loss")
    counts = torch.tensor([3, 4])
    hvd.allreduce_(counts)  # integer average truncates, as in Horovod
    odd = hvd.allreduce(loss, op=hvd.Adasum)
    scaled = hvd.allreduce(loss, prescale_factor=0.5)
    return n_correct, n_total, worst, counts, odd, scaled
