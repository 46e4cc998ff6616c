"""Rendezvous rounds of an elastic job, on the driver.

A round gives every worker in it a `World`. Round 0 forms when every initial worker has sent JOIN
(or ended). Round N+1 opens when a member of round N sends JOIN (its collective failed, or it
was told that hosts changed) and closes when every live member of round N has sent JOIN or
ended; every new worker already waiting joins it too, up to `max_workers`, and it forms only
with at least `min_workers` (the job waits for replacements meanwhile).

Ranks: the surviving members first, in the order of their previous rank (rank 0 keeps the
committed state the others receive), then the new workers by worker id. Hosts are numbered in
order of first appearance (cross_rank), local ranks count within a host in rank order.

The store: the driver hosts one torch c10d `TCPStore` for the whole job (as torchrun's c10d
rendezvous does) and every `World` carries its address; each round's process groups use the key
prefix `World.store_prefix`, so nothing of an earlier round collides with a later one. Like
torchrun's store it does not authenticate its clients: it holds only torch's rendezvous keys and
plain bytes, never pickles (when every worker is on this machine it listens on loopback only). Who is in a round and which rank each worker has go only over the
authenticated driver hub (`protocol.Kind.WORLD`); nothing is read back from the store.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .world import World


def assign_ranks(
    survivors: Sequence[Tuple[int, str]],
    newcomers: Sequence[Tuple[int, str]],
    round_number: int,
    store_host: str,
    store_port: int,
    formed_at: float = 0.0,
) -> Dict[int, World]:
    """The `World` of each worker of a round: `survivors` are (worker id, host) in the order of
    their previous rank, `newcomers` (worker id, host) in worker id order."""
    order = list(survivors) + sorted(newcomers)
    hosts: List[str] = []
    for _, host in order:
        if host not in hosts:
            hosts.append(host)
    local_sizes = {host: sum(1 for _, h in order if h == host) for host in hosts}
    seen: Dict[str, int] = {}
    worlds = {}
    for rank, (worker_id, host) in enumerate(order):
        local_rank = seen.get(host, 0)
        seen[host] = local_rank + 1
        worlds[worker_id] = World(
            round=round_number, rank=rank, size=len(order), local_rank=local_rank,
            local_size=local_sizes[host], cross_rank=hosts.index(host), cross_size=len(hosts),
            store_host=store_host, store_port=store_port, formed_at=formed_at)
    return worlds


class Rounds:
    """Who is in the current round and who waits for the next; pure bookkeeping (no I/O).

    The elastic job calls `join`, `leave` and `try_form` from its one control thread.
    """

    def __init__(self, initial: Sequence[Tuple[int, str]]) -> None:
        self.round = -1
        #: worker id -> (rank, host) in the current round; before round 0, the initial workers
        #: with their worker id as rank.
        self.members: Dict[int, Tuple[int, str]] = {wid: (wid, host) for wid, host in initial}
        #: worker id -> host of every worker that sent JOIN and waits for a round, in arrival order.
        self.waiting: Dict[int, str] = {}

    @property
    def open(self) -> bool:
        """A new round is wanted: none formed yet, every member of the current one ended, or a
        member left it (sent JOIN)."""
        return self.round < 0 or not self.members or any(wid in self.waiting for wid in self.members)

    def join(self, worker_id: int, host: str) -> bool:
        """`worker_id` sent JOIN; True if it is a member of the current round (it opens the next)."""
        self.waiting[worker_id] = host
        return worker_id in self.members

    def leave(self, worker_id: int) -> None:
        """The worker ended (failed, stopped or succeeded): no round waits for it any more."""
        self.members.pop(worker_id, None)
        self.waiting.pop(worker_id, None)

    def blocked_by(self) -> List[int]:
        """Members of the current round that have not sent JOIN yet (an open round waits for them)."""
        return [wid for wid in self.members if wid not in self.waiting]

    def try_form(
        self, min_workers: int, max_workers: int, store_host: str, store_port: int,
        formed_at: float = 0.0,
    ) -> Optional[Dict[int, World]]:
        """Form the next round if it is open, no live member is still out, and enough workers
        wait; return the World of each admitted worker (None: not yet), stamped `formed_at`.
        Workers beyond `max_workers` stay waiting."""
        if not self.open or self.blocked_by():
            return None
        survivors = sorted(((rank, wid, host) for wid, (rank, host) in self.members.items()))
        chosen = [(wid, host) for _, wid, host in survivors]
        newcomers = sorted((wid, host) for wid, host in self.waiting.items() if wid not in self.members)
        room = max_workers - len(chosen)
        chosen_new = newcomers[:max(room, 0)]
        if len(chosen) + len(chosen_new) < min_workers:
            return None
        worlds = assign_ranks(chosen, chosen_new, self.round + 1, store_host, store_port, formed_at)
        self.round += 1
        self.members = {wid: (world.rank, self.waiting.pop(wid)) for wid, world in worlds.items()}
        return worlds

    def newcomers_waiting(self) -> List[int]:
        """Workers waiting that are not members of the current round."""
        return [wid for wid in self.waiting if wid not in self.members]


def start_store(host: str) -> Any:
    """The job's c10d store: a `TCPStore` server on the driver, on a free port (`.port`); on
    loopback only when `host` is a loopback address (every worker is on this machine)."""
    from torch.distributed import TCPStore

    from ..netif import loopback_listener

    listener = loopback_listener(host, 0)
    if listener is None:
        return TCPStore(host, 0, is_master=True, wait_for_workers=False)
    port = listener.getsockname()[1]
    return TCPStore(host, port, is_master=True, wait_for_workers=False,
                    master_listen_fd=listener.detach())
