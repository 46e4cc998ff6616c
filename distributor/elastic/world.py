"""A worker's place in one rendezvous round of an elastic job.

The driver sends a `World` to each worker when a round forms (`protocol.Kind.WORLD`); the worker
then joins the round's process group through the job's c10d store, under the round's key prefix,
so nothing of an earlier round can collide with it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict


class HostUpdate(enum.IntFlag):
    """What changed in the job's hosts (Horovod's `HostUpdateResult` values)."""

    NO_UPDATE = 0
    REMOVED = 1
    ADDED = 2
    MIXED = REMOVED | ADDED


@dataclass(frozen=True)
class World:
    """One worker's place in round `round`: torchrun's coordinates plus the round's store."""

    round: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    store_host: str
    store_port: int
    #: The driver's `time.time()` when the round formed. Host notices (`HostUpdate`, stamped
    #: with the same clock) older than it were about an earlier round; later ones are about
    #: this one, even when they reach the worker before it has finished joining.
    formed_at: float = 0.0

    @property
    def store_prefix(self) -> str:
        """Key prefix of this round in the job's store: every process group of the round uses it."""
        return f"elastic/round{self.round}/"

    def torchrun_env(self) -> Dict[str, str]:
        """The torchrun variables for this round (what `os.environ` says after a re-join)."""
        return {
            "RANK": str(self.rank), "WORLD_SIZE": str(self.size),
            "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(self.cross_rank), "NODE_RANK": str(self.cross_rank),
            "GROUP_WORLD_SIZE": str(self.cross_size),
            "ROLE_RANK": str(self.rank), "ROLE_WORLD_SIZE": str(self.size),
            "MASTER_ADDR": self.store_host, "MASTER_PORT": str(self.store_port),
        }
