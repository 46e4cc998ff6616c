"""The placement interface: find slots for the ranks, start them, stop them.

A placement says what it supports in `capabilities` (as launchers do); the engine reads that
instead of probing attributes. An elastic job (`distributor.elastic`) also asks it where the
initial workers run (`worker_hosts`), to start one more worker while the job runs (`add_worker`)
and to stop one (`stop_worker`).
"""
from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..hub import routable_address
from ..launchers import Launcher
from ..spec import LaunchRequest, RankSpec
from ..supervisor import RankEventSink, Supervisor


@dataclass(frozen=True)
class JobContext:
    """What a placement needs from the engine to start the ranks of one job."""

    request: LaunchRequest
    run_id: str
    hub_address: Tuple[str, int]
    secret: bytes
    sink: RankEventSink
    launcher: Launcher


def host_plan(hosts: Sequence[Tuple[str, int]], num_processes: int) -> List[RankSpec]:
    """Ranks host by host: host i runs the next `slots` ranks (fewer on the last one used)."""
    specs: List[RankSpec] = []
    used = []
    left = num_processes
    for host, slots in hosts:
        take = min(slots, left)
        if take:
            used.append(take)
        left -= take
    for node, count in enumerate(used):
        for local in range(count):
            specs.append(RankSpec(rank=len(specs), world_size=num_processes, local_rank=local,
                                  local_world_size=count, node_rank=node, num_nodes=len(used)))
    return specs


@dataclass(frozen=True)
class PlacementCapabilities:
    """What a placement supports.

    - `adds_workers`: `add_worker` and `stop_worker` work while the job runs (after `start`), so
      an elastic job can replace a failed worker or use a host that discovery added.
    - `loses_tasks`: its tasks can be lost with the process that hosts them (a Spark executor),
      and once `finished()` it says which (`lost_tasks`).
    """

    adds_workers: bool = False
    loses_tasks: bool = False


class Placement(abc.ABC):
    """Decides where each rank runs and owns the processes (or Spark job) it starts.

    Ranks are identified by a worker id: in a fixed-size job the rank; in an elastic job the
    initial workers are 0..n-1 and each added worker gets the next unused id (its rank changes
    from round to round, its id never does; output lines and HELLO carry the id).
    """

    #: Address the ranks use to reach the driver hub; "127.0.0.1" for ranks on this host.
    hub_bind_host: str = "127.0.0.1"
    capabilities = PlacementCapabilities()

    def validate(self, request: LaunchRequest) -> None:
        """Raise `LaunchValidationError` if the request cannot run here; before anything starts."""

    @abc.abstractmethod
    def start(self, job: JobContext) -> None:
        """Start every rank; return once they are starting (not finished)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every rank that is still running (first SIGTERM, then SIGKILL)."""

    def failure(self) -> Optional[BaseException]:
        """An error of the placement itself (not of a rank) that ends the job, once it happened.

        The engine stops every rank and raises it when no rank failed first. Local: never.
        """
        return None

    def lost_tasks(self) -> Dict[int, str]:
        """{task: why} for each of the placement's tasks (the index its agent announced with
        ``Kind.AGENT``) that was lost with the process that hosted it (a Spark executor): its
        ranks were lost with it, whatever the others reported. Local: none."""
        return {}

    def finished(self) -> bool:
        """True once no rank of this placement can still be running (a Spark job that ended).

        Lets the engine stop waiting for exit reports that a killed task can no longer send.
        """
        return False

    def close(self) -> None:
        """Release what `start` acquired; called once after every rank has ended."""

    # ---- elastic jobs (only where `capabilities.adds_workers`) ------------------------------
    def worker_hosts(self, request: LaunchRequest) -> List[str]:
        """The host name of each initial worker (index = worker id), as `start` places them.

        An elastic job takes these names as its hosts when it has no discovery; a replacement
        goes to the failed worker's host. Default: every worker on "localhost".
        """
        return ["localhost"] * request.num_processes

    def store_host(self) -> str:
        """The address workers use to reach a server on the driver (the elastic job's c10d
        store, which listens on every interface); called after `start`. Default: the hub's
        bind address, or this host's routable address when the hub listens everywhere."""
        if self.hub_bind_host not in ("0.0.0.0", "", "::"):
            return self.hub_bind_host
        return routable_address()

    def add_worker(self, worker_id: int, host: str) -> None:
        """Start one more worker, id `worker_id`, on `host` (one of the job's host names) while
        the job runs; return once it is starting. Its events reach the job's sink under that id.
        Its torchrun variables before it joins a round are placeholders (`join_world` sets the
        real ones)."""
        raise NotImplementedError(f"{type(self).__name__} cannot add workers to a running job")

    def stop_worker(self, worker_id: int) -> None:
        """Stop one worker (SIGTERM, then SIGKILL) without waiting; its exit is reported as usual."""
        raise NotImplementedError(f"{type(self).__name__} cannot stop a single worker")


def added_worker_spec(worker_id: int) -> RankSpec:
    """The `RankSpec` a placement starts an added worker with: placeholder coordinates (rank =
    worker id, one rank per host), since the worker learns its real ones when it joins a round."""
    return RankSpec(rank=worker_id, world_size=worker_id + 1, local_rank=0, local_world_size=1,
                    node_rank=0, num_nodes=1)


def stop_in_background(supervisor: Optional[Supervisor], worker_id: int) -> None:
    """`Placement.stop_worker` for a placement whose supervisor runs the worker: SIGTERM, then
    SIGKILL after the grace period, from a thread so the caller does not wait."""
    if supervisor is not None:
        threading.Thread(target=supervisor.stop, args=([worker_id],),
                         name=f"stop-worker-{worker_id}", daemon=True).start()
