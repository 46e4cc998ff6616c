"""``ElasticSampler``: a distributed sampler that remembers which samples were processed this epoch,
so a restored job does not repeat (or skip) them."""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Sized

import torch
import torch.distributed as dist

from .. import lifecycle
from ..functions import allgather_object

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Shard ``dataset`` over the ranks, skipping samples already processed in this epoch.

    Call ``record_batch(batch_idx, batch_size)`` (or ``record_indices``) after each batch and
    ``set_epoch(epoch)`` at each new epoch; the state travels in ``TorchState``.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.indices: List[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start a new epoch: nothing processed yet, a new shuffle."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark this rank's batch ``batch_idx`` (of ``batch_size`` samples) as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def sync(self) -> None:
        """Every rank learns the samples processed by any rank (used by ``TorchState.sync``)."""
        everyone = allgather_object(sorted(self.processed_indices))
        self.processed_indices = set().union(*map(set, everyone))
        self.reset()

    def _topology(self) -> tuple:
        try:
            return lifecycle.size(), lifecycle.rank()
        except ValueError:  # before hvd.init(): a single replica
            return 1, 0

    def reset(self) -> None:
        """Recompute this rank's shard of the not-yet-processed samples."""
        self.num_replicas, self.rank = self._topology()
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            order = list(range(len(self.dataset)))
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        indices = list(self.remaining_indices)
        if indices:
            while len(indices) < self.total_size:  # pad so every rank gets the same count
                indices += indices[:self.total_size - len(indices)]
        self.indices = indices[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
