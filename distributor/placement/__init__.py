"""Where ranks run: on this host (`local`) or as a Spark barrier stage (`spark`)."""
from .base import JobContext, Placement
from .local import LocalPlacement
from .spark import SparkPlacement, SparkPlacementError

__all__ = ["JobContext", "LocalPlacement", "Placement", "SparkPlacement", "SparkPlacementError"]
