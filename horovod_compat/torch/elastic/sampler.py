"""``ElasticSampler``: a distributed sampler that knows how much of the epoch the job has processed,
so after a reset the rest of the epoch is split over the new world without repeating or skipping a
sample (Horovod 0.28.1's behaviour and order).

The epoch's order is one permutation shared by every rank (``random.Random(seed + epoch)``).  The job
works through it front to back: a batch step of ``batch_size`` samples per rank consumes the next
``batch_size * num_replicas`` entries (rank ``r`` takes every ``num_replicas``-th from ``r``), which
``record_batch`` counts in ``processed_num``.  ``reset()`` (after ``load_state_dict`` or a new world)
keeps the entries from ``processed_num`` on and deals them out again, so whatever the number of
ranks before and after, the processed part is a prefix of the permutation and the rest is dealt
once.  As with ``DistributedSampler``, the last step is padded with the first remaining entries
when they do not divide evenly.
"""
from __future__ import annotations

import math
import random
from typing import Any, Dict, Iterator, List, Sized

import torch

from horovod_compat.common import lifecycle

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Shard ``dataset`` over the ranks and re-shard what is left of the epoch after a reset.

    Track it in a ``TorchState``, call ``record_batch(batch_idx, batch_size)`` after each step and
    ``set_epoch(epoch + 1)`` at the end of each epoch (not the beginning: a resumed epoch must not
    start over).  ``seed`` must be the same on every rank.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: List[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: List[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order, nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """One step of ``batch_size`` samples per rank is done (by every rank of the job)."""
        self.processed_num += batch_size * self.num_replicas

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        """This rank's dataset indices of batch ``batch_idx`` of the current pass (``batch_size``
        per rank), e.g. to log which samples a step saw."""
        mine = self._my_indices()
        return mine[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.take_progress(state_dict)
        self.reset()

    def take_progress(self, state_dict: Dict[str, Any]) -> None:
        """``load_state_dict`` without dealing the rest of the epoch over the world (`reset`):
        for a restore while Horovod is not initialised (after a failed re-join)."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]

    def reset(self) -> None:
        """Take the current world (``hvd.size()``/``hvd.rank()``) and deal out the rest of the epoch."""
        self.num_replicas, self.rank = lifecycle.size(), lifecycle.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def _my_indices(self) -> List[int]:
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:  # fewer left than ranks: wrap round again
            padded += padded[:self.total_size - len(padded)]
        return padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        self.indices = self._my_indices()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
