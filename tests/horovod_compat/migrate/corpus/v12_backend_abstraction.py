"""Style: framework/library module: a DistributedBackend ABC with a HorovodBackend subclass (lazy horovod import); training code talks only to the backend object.
"""
import abc

import torch
import torch.nn as nn


class DistributedBackend(abc.ABC):
    """Interface a training library exposes so users can swap DDP/Horovod/single-process."""

    @abc.abstractmethod
    def setup(self) -> None: ...

    @property
    @abc.abstractmethod
    def rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def world_size(self) -> int: ...

    @abc.abstractmethod
    def wrap_optimizer(self, opt: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer: ...

    @abc.abstractmethod
    def broadcast_model(self, model: nn.Module, opt: torch.optim.Optimizer) -> None: ...

    @abc.abstractmethod
    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def barrier(self) -> None: ...

    def is_main_process(self) -> bool:
        return self.rank == 0


class HorovodBackend(DistributedBackend):
    def __init__(self, fp16_compression: bool = False):
        self._hvd = None
        self._fp16 = fp16_compression
        self._reduce_count = 0

    def setup(self) -> None:
        import horovod.torch as hvd  # optional dependency, imported lazily

        hvd.init()
        self._hvd = hvd

    @property
    def rank(self) -> int:
        return self._hvd.rank()

    @property
    def local_rank(self) -> int:
        return self._hvd.local_rank()

    @property
    def world_size(self) -> int:
        return self._hvd.size()

    def wrap_optimizer(self, opt, model):
        hvd = self._hvd
        compression = hvd.Compression.fp16 if self._fp16 else hvd.Compression.none
        return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                        compression=compression)

    def broadcast_model(self, model, opt):
        self._hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self._hvd.broadcast_optimizer_state(opt, root_rank=0)

    def all_reduce_mean(self, tensor):
        self._reduce_count += 1
        return self._hvd.allreduce(tensor, op=self._hvd.Average,
                                   name=f"backend.all_reduce_mean.{self._reduce_count}")

    def barrier(self):
        self._hvd.barrier()


def build_backend(name: str) -> DistributedBackend:
    registry = {"horovod": HorovodBackend}
    return registry[name]()


def fit(backend: DistributedBackend, model: nn.Module, steps: int = 6):
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3 * backend.world_size)
    optimizer = backend.wrap_optimizer(optimizer, model)
    backend.broadcast_model(model, optimizer)

    gen = torch.Generator().manual_seed(9000 + backend.rank)
    criterion = nn.MSELoss()
    for step in range(steps):
        x = torch.randn(12, 7, generator=gen)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"CORPUS rank={backend.rank} step={step} loss={loss.item():.6f}", flush=True)
        backend.all_reduce_mean(loss.detach())
    backend.barrier()
    return model


def main():
    backend = build_backend("horovod")
    backend.setup()
    torch.manual_seed(123)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(7, 16), nn.SiLU(), nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 1))
    model = fit(backend, model)
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={backend.rank} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
