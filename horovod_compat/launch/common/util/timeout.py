"""``horovod.runner.common.util.timeout``: a deadline that names what was being waited for."""
from __future__ import annotations

import time

__all__ = ["Timeout", "TimeoutException"]


class TimeoutException(Exception):
    """Raised by ``Timeout.check_time_out_for`` once the deadline has passed."""


class Timeout:
    """A deadline `timeout` seconds from now; `message` may name ``{activity}``."""

    def __init__(self, timeout: float, message: str) -> None:
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self.message = message

    def remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def timed_out(self) -> bool:
        return time.monotonic() > self._deadline

    def check_time_out_for(self, activity: str) -> None:
        if self.timed_out():
            raise TimeoutException(self.message.format(activity=activity))
