"""Where ranks run: on this host (`local`), on a list of hosts over ssh (`hosts`), as a Spark
barrier stage (`spark`) or on Ray nodes (`ray`; Ray is imported only when a job is placed there)."""
from .base import JobContext, Placement
from .hosts import HostsPlacement
from .local import LocalPlacement
from .ray import RayPlacement
from .spark import SparkPlacement, SparkPlacementError

__all__ = ["HostsPlacement", "JobContext", "LocalPlacement", "Placement", "RayPlacement", "SparkPlacement",
           "SparkPlacementError"]
