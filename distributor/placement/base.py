"""The placement interface: find slots for the ranks, start them, stop them."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Optional, Tuple

from ..launchers import Launcher
from ..spec import LaunchRequest
from ..supervisor import RankEventSink


@dataclass(frozen=True)
class JobContext:
    """What a placement needs from the engine to start the ranks of one job."""

    request: LaunchRequest
    run_id: str
    hub_address: Tuple[str, int]
    secret: bytes
    sink: RankEventSink
    launcher: Launcher


class Placement(abc.ABC):
    """Decides where each rank runs and owns the processes (or Spark job) it starts."""

    #: Address the ranks use to reach the driver hub; "127.0.0.1" for ranks on this host.
    hub_bind_host: str = "127.0.0.1"

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

    def finished(self) -> bool:
        """True once no rank of this placement can still be running (a Spark job that ended).

        Lets the engine stop waiting for exit reports that a killed task can no longer send.
        """
        return False

    def close(self) -> None:
        """Release what `start` acquired; called once after every rank has ended."""
