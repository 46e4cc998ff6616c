"""Exceptions the engine raises on the driver.

Every failure of a job reaches the caller as one `DistributedRunError` (a `RuntimeError`, so code
that caught PySpark's generic errors keeps working), raised only after every rank has stopped.
"""
from __future__ import annotations

from typing import Optional, Sequence


_TAIL_SHOWN = 40


class DistributedRunError(RuntimeError):
    """Base class of every error the engine raises on the driver."""


class LaunchValidationError(DistributedRunError, ValueError):
    """The launch request is wrong; raised before any process is started."""


class PayloadPicklingError(LaunchValidationError):
    """The function, an argument or a return value cannot be pickled."""


class RankFailedError(DistributedRunError):
    """A rank raised, exited non-zero or was killed by a signal.

    Attributes name the first failing rank and carry what it reported: `rank`, `exit_code`
    (negative for a signal, as in `subprocess`), `exc_type`, `exc_message`, `traceback` (the
    rank's formatted traceback, or None when the process died without one) and `output_tail`
    (its last output lines; every line was already printed live). `other_failures` lists later failures as (rank, summary) pairs.
    """

    def __init__(
        self,
        rank: int,
        exit_code: Optional[int],
        exc_type: Optional[str] = None,
        exc_message: Optional[str] = None,
        traceback: Optional[str] = None,
        output_tail: Sequence[str] = (),
        other_failures: Sequence[tuple[int, str]] = (),
    ) -> None:
        self.rank = rank
        self.exit_code = exit_code
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.traceback = traceback
        self.output_tail = list(output_tail)
        self.other_failures = list(other_failures)
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [f"Rank {self.rank} failed ({describe_exit(self.exit_code)})"]
        if self.exc_type:
            lines[0] += f": {self.exc_type}: {self.exc_message}"
        if self.traceback:
            lines += ["", f"Traceback from rank {self.rank}:", self.traceback.rstrip()]
        elif self.output_tail:
            shown = self.output_tail[-_TAIL_SHOWN:]
            lines += ["", f"Last {len(shown)} output lines of rank {self.rank}:"]
            lines += [f"  {line}" for line in shown]
        if self.other_failures:
            lines += ["", "Other ranks stopped afterwards:"]
            lines += [f"  rank {rank}: {summary}" for rank, summary in self.other_failures]
        return "\n".join(lines)

    def __reduce__(self):
        return (
            type(self),
            (self.rank, self.exit_code, self.exc_type, self.exc_message, self.traceback,
             self.output_tail, self.other_failures),
        )


class LaunchTimeoutError(DistributedRunError, TimeoutError):
    """Some ranks did not connect to the driver within the start timeout."""


class JobTimeoutError(DistributedRunError, TimeoutError):
    """The job ran longer than its timeout; every rank was stopped."""


def describe_exit(exit_code: Optional[int]) -> str:
    """Human wording for a process exit status as `subprocess` reports it."""
    if exit_code is None:
        return "still running when stopped"
    if exit_code < 0:
        import signal

        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"killed by {name}"
    return f"exit status {exit_code}"


class ElasticJobFailedError(DistributedRunError):
    """An elastic job gave up: its failure policy allowed no further reset.

    `reason` says what happened and `advice` what to change; `attempts` lists every reset
    (`distributor.elastic.policy.Attempt`) in order, and `root_cause` is the `RankFailedError` of
    the failure that ended the job (None when none did, e.g. a timeout waiting for workers).
    """

    def __init__(self, reason: str, advice: str, attempts: Sequence = (),
                 root_cause: Optional[RankFailedError] = None) -> None:
        self.reason = reason
        self.advice = advice
        self.attempts = list(attempts)
        self.root_cause = root_cause
        lines = [f"The elastic job failed: {reason}"]
        if self.attempts:
            lines += ["", f"Attempts ({len(self.attempts)}):"]
            lines += [f"  {attempt.describe()}" for attempt in self.attempts]
        else:
            lines += ["", "Attempts: none (no worker had failed before)."]
        if root_cause is not None:
            lines += ["", "Root cause:", str(root_cause)]
        lines += ["", f"To fix: {advice}"]
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.reason, self.advice, self.attempts, self.root_cause))


class ElasticTimeoutError(ElasticJobFailedError, TimeoutError):
    """An elastic job had fewer than `min_workers` workers for longer than `elastic_timeout`."""
