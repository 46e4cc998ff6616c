"""Horovod imported name by name and by submodule, as real projects do."""
import torch
from horovod.torch import allreduce, Average, broadcast_parameters
import horovod.torch.mpi_ops as mpi_ops
from horovod.torch.functions import broadcast_object
from horovod.torch import mpi_ops as ops2
from horovod.common.exceptions import HorovodInternalError
from horovod import run


def main():
    mpi_ops.init()
    model = torch.nn.Linear(2, 1)
    broadcast_parameters(model.state_dict(), root_rank=0)
    x = allreduce(torch.ones(2) * mpi_ops.rank(), op=Average)
    cfg = broadcast_object({"lr": 0.1}, root_rank=0)
    try:
        print(f"rank {ops2.rank()} of {ops2.size()} x {x.tolist()} cfg {cfg}")
    except HorovodInternalError:
        raise


def shadowed(allreduce=None):
    return allreduce  # the parameter, not Horovod's: left alone


if __name__ == "__main__":
    run(main, np=2)
