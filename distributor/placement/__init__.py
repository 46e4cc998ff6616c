"""Where ranks run: on this host (`local`), on a list of hosts over ssh (`hosts`) or as a Spark
barrier stage (`spark`)."""
from .base import JobContext, Placement
from .hosts import HostsPlacement
from .local import LocalPlacement
from .spark import SparkPlacement, SparkPlacementError

__all__ = ["HostsPlacement", "JobContext", "LocalPlacement", "Placement", "SparkPlacement", "SparkPlacementError"]
