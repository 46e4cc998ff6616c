"""The failure policy of an elastic job, and the record of every reset it made.

Horovod's names map onto it: `min_np`/`max_np` → `min_workers`/`max_workers`, `reset_limit`,
`elastic_timeout`, `blacklist_cooldown_range` → `cooldown_range`, the host discovery script →
`discovery` (a callable; `horovod_compat.launch` wraps the script).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

from ..errors import LaunchValidationError

#: Returns the hosts that may run workers now and their slots, e.g. {"host-1": 4}.
HostDiscovery = Callable[[], Mapping[str, int]]


@dataclass(frozen=True)
class ElasticPolicy:
    """When an elastic job recovers, and when it gives up.

    - `min_workers`: below this many live workers the job waits (at most `elastic_timeout`
      seconds) for replacements or new hosts before it fails.
    - `max_workers`: never more workers than this, whatever discovery offers.
    - `reset_limit`: how many resets (new rounds caused by a failure or a host change) the job
      may make; None is unlimited, as in Horovod. A worker's Python exception that already caused
      a reset once is not retried again whatever the limit: it is the training code's bug.
    - `cooldown_range`: (min, max) seconds a host whose worker failed waits before a replacement
      starts there (doubling per failure of that host, within the range); None: at once.
    - `discovery`: the hosts and slots available now, polled every `discovery_interval`
      seconds; None: the hosts the job started on stay the hosts.
    """

    min_workers: int
    max_workers: int
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600.0
    cooldown_range: Optional[Tuple[float, float]] = None
    discovery: Optional[HostDiscovery] = None
    discovery_interval: float = 1.0

    def __post_init__(self) -> None:
        for name in ("min_workers", "max_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LaunchValidationError(f"{name} must be an int >= 1, got {value!r}.")
        if self.min_workers > self.max_workers:
            raise LaunchValidationError(
                f"min_workers={self.min_workers} is larger than max_workers={self.max_workers}; "
                "lower the minimum or raise the maximum.")
        if self.reset_limit is not None and (isinstance(self.reset_limit, bool) or
                                             not isinstance(self.reset_limit, int) or self.reset_limit < 0):
            raise LaunchValidationError(f"reset_limit must be an int >= 0 or None, got {self.reset_limit!r}.")
        for name in ("elastic_timeout", "discovery_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise LaunchValidationError(f"{name} must be a positive number of seconds, got {value!r}.")
        if self.cooldown_range is not None:
            low, high = self.cooldown_range
            if not (0 <= low <= high):
                raise LaunchValidationError(
                    f"cooldown_range must be (min_seconds, max_seconds) with 0 <= min <= max, "
                    f"got {self.cooldown_range!r}.")
        if self.discovery is not None and not callable(self.discovery):
            raise LaunchValidationError(f"discovery must be callable, got {self.discovery!r}.")


@dataclass(frozen=True)
class Attempt:
    """One reset of an elastic job (or one restart of a restart-all job): when, why, what then."""

    number: int
    time: float
    cause: str
    action: str

    def describe(self) -> str:
        return f"reset {self.number}: {self.cause} -> {self.action}"
