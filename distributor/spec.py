"""What to run and how: the dataclasses a launch is described by.

A `LaunchRequest` is everything the engine needs to know, independent of where the ranks run
(placement) and how their processes are started (launcher).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from .elastic.policy import ElasticPolicy
from .errors import LaunchTypeError, LaunchValidationError

#: Called for every output line: (rank, stream name "stdout"/"stderr", line without newline).
OutputHandler = Callable[[Optional[int], str, str], None]
#: Called for every message a rank sends with `distributor.worker.send_to_driver`: (rank, message).
MessageHandler = Callable[[int, Any], None]


@dataclass(frozen=True)
class FunctionTarget:
    """Run `fn(*args, **kwargs)` in every rank; the return value is sent back to the driver."""

    fn: Callable[..., Any]
    args: Tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def description(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


@dataclass(frozen=True)
class ScriptTarget:
    """Run a Python script as `__main__` with `argv`, as `torchrun script.py argv...` would."""

    path: str
    argv: Tuple[str, ...] = ()

    @property
    def description(self) -> str:
        return self.path


@dataclass(frozen=True)
class CommandTarget:
    """Run an arbitrary command (e.g. `pytest test_x.py`) as each rank, like `horovodrun CMD`."""

    argv: Tuple[str, ...]

    @property
    def description(self) -> str:
        return " ".join(self.argv)


Target = Union[FunctionTarget, ScriptTarget, CommandTarget]


#: `LaunchRequest.heartbeat_timeout` unless given.
DEFAULT_HEARTBEAT_TIMEOUT = 120.0


@dataclass(frozen=True)
class LaunchRequest:
    """A job: `target` on `num_processes` ranks.

    `env` is added to every rank's environment. `start_timeout` bounds the time until every rank
    has connected to the driver; `timeout` (None: no limit) bounds the whole job. A connected rank
    that sends no heartbeat (every second, `rank_entry.HEARTBEAT_INTERVAL`) for `heartbeat_timeout`
    seconds before its result ends the job as the rank that stopped responding: its process is
    stopped or hung in native code that holds the GIL, or its host or network is lost.
    `return_all` returns every rank's value in rank order instead of rank 0's.

    Failures: by default the first failing rank ends the job. `max_restarts=N` restarts every rank
    from the start up to N times, as torchrun does. `elastic` (an `ElasticPolicy`) makes the job
    elastic: a failed worker is replaced while the others keep their memory, and the workers meet
    in a new rendezvous round (`distributor.elastic`); `num_processes` is then the initial size.
    """

    target: Target
    num_processes: int
    use_gpu: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout: float = 120.0
    timeout: Optional[float] = None
    return_all: bool = False
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    max_restarts: int = 0
    elastic: Optional[ElasticPolicy] = None

    def __post_init__(self) -> None:
        validate_num_processes(self.num_processes, "num_processes")
        validate_max_restarts(self.max_restarts)
        if self.elastic is not None:
            if not isinstance(self.elastic, ElasticPolicy):
                raise LaunchValidationError(f"elastic must be an ElasticPolicy, got {self.elastic!r}.")
            if self.max_restarts:
                raise LaunchValidationError(
                    "max_restarts (restart every rank) and elastic (replace the failed worker) are two "
                    "failure policies; pass one of them.")
            if not self.elastic.min_workers <= self.num_processes <= self.elastic.max_workers:
                raise LaunchValidationError(
                    f"num_processes={self.num_processes} must lie between the elastic policy's "
                    f"min_workers={self.elastic.min_workers} and max_workers={self.elastic.max_workers}.")
        for name in ("use_gpu", "return_all"):
            if not isinstance(getattr(self, name), bool):
                raise LaunchValidationError(
                    f"{name} must be True or False, got {getattr(self, name)!r}."
                )
        for name in ("start_timeout", "heartbeat_timeout"):
            _check_positive_seconds(name, getattr(self, name))
        if self.timeout is not None:
            _check_positive_seconds("timeout", self.timeout)
        bad = {k: v for k, v in self.env.items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise LaunchValidationError(
                f"env must map str to str; these entries are not strings: {bad!r}. "
                "Convert the values with str()."
            )
        if isinstance(self.target, ScriptTarget):
            if not os.path.isfile(self.target.path):
                raise LaunchValidationError(
                    f"Training script {self.target.path!r} does not exist (looked in "
                    f"{os.getcwd()!r}). Pass an existing file path or a callable."
                )
            if not all(isinstance(a, str) for a in self.target.argv):
                raise LaunchValidationError(
                    f"Script arguments must be strings, got {list(self.target.argv)!r}; "
                    "convert them with str() as you would on a torchrun command line."
                )
        elif isinstance(self.target, CommandTarget):
            if not self.target.argv or not all(isinstance(a, str) for a in self.target.argv):
                raise LaunchValidationError(
                    f"A command must be a non-empty list of strings, got {list(self.target.argv)!r}."
                )
        elif not callable(self.target.fn):
            raise LaunchValidationError(f"{self.target.fn!r} is not callable.")


@dataclass(frozen=True)
class RankSpec:
    """One rank's place in the job; the environment contract derives from it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    gpu_ids: Sequence[str] = ()


def validate_num_processes(value: Any, name: str) -> int:
    """Accept only a real positive int (not bool, float or str)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LaunchTypeError(
            f"{name} must be a positive int, got {value!r} ({type(value).__name__}). "
            f"Pass e.g. {name}=2."
        )
    if value < 1:
        # "has to be a positive integer": PySpark's TorchDistributor's words, which callers match
        raise LaunchValidationError(
            f"{name} has to be a positive integer (at least 1), got {value}. Pass e.g. {name}=2.")
    return value


def validate_max_restarts(value: Any) -> int:
    """Accept only an int >= 0 (how many times a failed job runs again)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LaunchValidationError(f"max_restarts must be an int >= 0, got {value!r}.")
    return value


def _check_positive_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise LaunchValidationError(f"{name} must be a positive number of seconds, got {value!r}.")


EnvDict = Dict[str, str]
ArgList = Sequence[str]
