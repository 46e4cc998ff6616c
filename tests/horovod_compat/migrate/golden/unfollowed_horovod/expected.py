import importlib

import torch
import torch.distributed.optim
from mylib import horovod_support

# TODO(horovod-compat): 'horovod.torch': names Horovod's module in a string: code that imports it at run time (importlib.import_module, __import__) is not followed by the rewriter; import it as `import horovod.torch as hvd` where it is used, or migrate that code by hand
BACKEND = "horovod.torch"
LOCK = "horovod.lock"  # a FileLock's file name (synml's horovod-tutorial), not a module: no TODO


class Backend:
    def __init__(self):
        self.module = importlib.import_module(BACKEND)

    def wrap(self, model, optimizer):
        # TODO(horovod-compat): self.module.DistributedOptimizer: looks like Horovod's DistributedOptimizer, reached through `self.module`, which this file does not import from horovod.torch: the rewriter cannot follow it (import horovod.torch as hvd where it is used, or migrate it by hand)
        optimizer = self.module.DistributedOptimizer(optimizer)
        # TODO(horovod-compat): self.module.broadcast_optimizer_state: looks like Horovod's broadcast_optimizer_state, reached through `self.module`, which this file does not import from horovod.torch: the rewriter cannot follow it (import horovod.torch as hvd where it is used, or migrate it by hand)
        self.module.broadcast_optimizer_state(optimizer, root_rank=0)
        return optimizer


def through_a_wrapper_module(model, optimizer):
    hvd = horovod_support.hvd
    # TODO(horovod-compat): hvd.DistributedOptimizer: looks like Horovod's DistributedOptimizer, reached through `hvd`, which this file does not import from horovod.torch: the rewriter cannot follow it (import horovod.torch as hvd where it is used, or migrate it by hand)
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def torchs_own_rpc_optimizer(remote_params):
    # torch's RPC DistributedOptimizer: not Horovod's, no TODO
    return torch.distributed.optim.DistributedOptimizer(torch.optim.SGD, remote_params, lr=0.05)
