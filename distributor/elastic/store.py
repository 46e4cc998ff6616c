"""The store a worker of an elastic job joins a round through: the job's store, under the round's
key prefix, with waits that end when the round has lost a member.

Joining a round (``init_process_group``, each ``new_group``, the topology exchange) blocks in
waits for keys that every member sets. A member that dies before it sets them leaves the others
in those waits until the store's timeout (minutes), since nothing else tells them. The driver
does tell them: it sends every member of the round a `protocol.Kind.LOST` frame as soon as it
sees one fail (`worker.lost_member`). `RoundStore` waits in short slices and, between them,
looks for that notice; once it came, the wait raises `RoundLostError` and the worker re-joins the
next round.

Torch calls these methods from C++ (gloo's rendezvous included), so the store is a Python
subclass of `torch.distributed.Store`; a wait polls ``check`` (one round trip to the store) with
a delay that doubles from 1 ms up to `POLL_SECONDS`, rather than slicing the store's own ``wait``,
whose timeouts torch logs as warnings.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch.distributed as dist

__all__ = ["RoundLostError", "RoundStore", "POLL_SECONDS"]

#: Longest pause between two looks at the keys a wait needs (and at the driver's notice).
POLL_SECONDS = 0.05


class RoundLostError(RuntimeError):
    """A member of the round this worker is joining failed: the round cannot form."""


class RoundStore(dist.Store):
    """`base` (the round's prefix store) whose waits raise `RoundLostError` once `lost()` names a
    failed member of round `round_number`."""

    def __init__(self, base: dist.Store, round_number: int, lost: Callable[[], Optional[int]]) -> None:
        super().__init__()
        self.base, self.round_number, self.lost = base, round_number, lost
        self.set_timeout(base.timeout)

    def _check_lost(self) -> None:
        rank = self.lost()
        if rank is not None:
            raise RoundLostError(f"rank {rank} of round {self.round_number} failed while this "
                                 "worker joined the round")

    def wait(self, keys: List[str], timeout: Optional[timedelta] = None) -> None:
        limit = (timeout or self.timeout).total_seconds()
        deadline = time.monotonic() + limit if limit > 0 else None
        delay = 0.001
        while not self.base.check(keys):
            self._check_lost()
            if deadline is not None and time.monotonic() >= deadline:
                raise dist.DistStoreError(f"timed out after {limit:g} s waiting for the keys "
                                          f"{keys} of round {self.round_number}")
            time.sleep(delay)
            delay = min(delay * 2, POLL_SECONDS)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self.base.get(key)

    def set(self, key: str, value: Any) -> None:
        self.base.set(key, value)

    def add(self, key: str, amount: int) -> int:
        return self.base.add(key, amount)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self.base.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        return self.base.delete_key(key)

    def num_keys(self) -> int:
        return self.base.num_keys()

    def check(self, keys: List[str]) -> bool:
        return self.base.check(keys)
