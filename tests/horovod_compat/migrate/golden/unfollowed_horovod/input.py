import importlib

import torch
import torch.distributed.optim
from mylib import horovod_support

BACKEND = "horovod.torch"
LOCK = "horovod.lock"  # a FileLock's file name (synml's horovod-tutorial), not a module: no TODO


class Backend:
    def __init__(self):
        self.module = importlib.import_module(BACKEND)

    def wrap(self, model, optimizer):
        optimizer = self.module.DistributedOptimizer(optimizer)
        self.module.broadcast_optimizer_state(optimizer, root_rank=0)
        return optimizer


def through_a_wrapper_module(model, optimizer):
    hvd = horovod_support.hvd
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def torchs_own_rpc_optimizer(remote_params):
    # torch's RPC DistributedOptimizer: not Horovod's, no TODO
    return torch.distributed.optim.DistributedOptimizer(torch.optim.SGD, remote_params, lr=0.05)
