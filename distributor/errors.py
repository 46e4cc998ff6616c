"""Exceptions the engine raises on the driver.

Every failure of a job reaches the caller as one `DistributedRunError` (a `RuntimeError`, so code
that caught PySpark's generic errors keeps working), raised only after every rank has stopped.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple


_TAIL_SHOWN = 40

#: The first line of every Python traceback.
TRACEBACK_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line \d+')
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")
#: Packages whose frames `fold_frames` folds, by directory name -> label (see `fold_package`).
_FOLDED_PACKAGES: Dict[str, str] = {}


def fold_package(name: str, label: Optional[str] = None) -> None:
    """Fold the frames of the package `name` (files under a directory of that name, wherever it
    is installed, on this host or a rank's) in the tracebacks of `RankFailedError` and of
    `fold_frames`: a front end registers its own package so that its users see their code, not its
    internals. The engine registers none."""
    _FOLDED_PACKAGES[name] = label or name


def fold_frames(lines: Sequence[str], packages: Optional[Dict[str, str]] = None) -> List[str]:
    """A traceback's `lines` with each run of consecutive frames in one of the folded packages
    (default: those registered with `fold_package`) replaced by one line
    ``  ... (N frames in <package>)``. Frames of other code, and every other line, are kept."""
    packages = _FOLDED_PACKAGES if packages is None else packages
    if not packages:
        return list(lines)
    frames: List[Tuple[Optional[str], List[str]]] = []  # (package or None, the frame's lines)
    for line in lines:
        match = _FRAME.match(line)
        if match:
            frames.append((_package_of(match.group("path"), packages), [line]))
        elif frames and line.startswith("    ") and frames[-1][1][0].startswith("  File "):
            frames[-1][1].append(line)  # the frame's source line and its ^^^^ markers
        else:
            frames.append((None, [line]))
    out: List[str] = []
    i = 0
    while i < len(frames):
        package, chunk = frames[i]
        j = i
        while package is not None and j + 1 < len(frames) and frames[j + 1][0] == package:
            j += 1
        if package is not None:
            count = j - i + 1
            out.append(f"  ... ({count} frame{'s' if count > 1 else ''} in {package})")
        else:
            out.extend(chunk)
        i = j + 1
    return out


def _package_of(path: str, packages: Dict[str, str]) -> Optional[str]:
    """The label of the folded package `path` is a file of: under the package's directory on this
    host, or under an installed copy of it (`site-packages/<name>/`) on another. A directory that
    only has the package's name (a project's `tests/<name>/`) is not the package."""
    path = path.replace("\\", "/")
    for name, label in packages.items():
        if any(path.startswith(root + "/") for root in _package_roots(name)) \
                or f"/site-packages/{name}/" in path or f"/dist-packages/{name}/" in path:
            return label
    return None


@functools.lru_cache(maxsize=None)
def _package_roots(name: str) -> Tuple[str, ...]:
    """The directories the package `name` is imported from on this host (none if it is not)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ()
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    return tuple(os.path.realpath(p).replace("\\", "/") for p in locations) + \
        tuple(p.replace("\\", "/") for p in locations)


def last_traceback(lines: Sequence[str]) -> Optional[List[str]]:
    """The last complete Python traceback printed in `lines` (a rank's stderr, one string per
    line): from its ``Traceback (most recent call last):`` line to the exception's line, with the
    tracebacks it was chained to (``During handling of the above exception...``); None if none."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start] != TRACEBACK_HEADER:
            continue
        end = start + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        if end == len(lines):
            return None  # cut short
        while start >= 4 and lines[start - 1] == "" and lines[start - 2] in _CHAIN_LINES \
                and lines[start - 3] == "":
            earlier = _block_start(lines, start - 4)
            if earlier is None:
                break
            start = earlier
        return list(lines[start:end + 1])
    return None


_CHAIN_LINES = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def _block_start(lines: Sequence[str], last: int) -> Optional[int]:
    """Where the traceback whose exception line is `lines[last]` starts, or None."""
    if lines[last].startswith(" "):
        return None
    k = last - 1
    while k >= 0 and lines[k].startswith(" "):
        k -= 1
    return k if k >= 0 and lines[k] == TRACEBACK_HEADER else None


def parse_exception_line(line: str) -> Tuple[Optional[str], Optional[str]]:
    """(type, message) of a traceback's last line ``pkg.mod.Type: message``; the type without
    its module, as the ranks report it; (None, None) if the line is no exception line."""
    match = _EXCEPTION_LINE.match(line)
    if not match:
        return None, None
    return match.group("type").rsplit(".", 1)[-1], match.group("message") or ""


class DistributedRunError(RuntimeError):
    """Base class of every error the engine raises on the driver."""

    def add_line(self, line: str) -> None:
        """Append `line` to the message, after a blank line: what a front end knows of the
        failure beyond the engine (e.g. where it kept the ranks' output). The attributes stay
        as they are; a pickled copy carries the engine's message only."""
        message = str(self.args[0]) if self.args else ""
        self.args = (f"{message}\n\n{line}" if message else line, *self.args[1:])


class LaunchValidationError(DistributedRunError, ValueError):
    """The launch request is wrong; raised before any process is started."""


class LaunchTypeError(LaunchValidationError, TypeError):
    """An argument of the launch request has the wrong type (e.g. `num_processes="2"`); also a
    `TypeError`, as Python (and PySpark's TorchDistributor) raise for such arguments."""


class PayloadPicklingError(LaunchValidationError):
    """The function, an argument or a return value cannot be pickled."""


class RankFailedError(DistributedRunError):
    """A rank raised, exited non-zero or was killed by a signal.

    Attributes name the first failing rank and carry what it reported: `rank`, `exit_code`
    (negative for a signal, as in `subprocess`), `exc_type`, `exc_message`, `traceback` (the
    rank's formatted traceback, or None when the process died without one; shown with the frames
    of the packages registered with `fold_package` folded) and `output_tail` (its last output
    lines; every line was already printed live). `other_failures` lists the other ranks that
    failed or were stopped afterwards as (rank, one-line summary) pairs. `reason`, when set,
    says why a rank that did not fail itself is the root cause (it stopped responding while the
    others failed waiting for it) and replaces "failed" in the first line; `outcome`, when set,
    says how it ended where its exit status cannot (a rank lost with the machine that ran it).
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
        reason: Optional[str] = None,
        outcome: Optional[str] = None,
    ) -> None:
        self.rank = rank
        self.reason = reason
        self.outcome = outcome
        self.exit_code = exit_code
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.traceback = traceback
        self.output_tail = list(output_tail)
        self.other_failures = list(other_failures)
        super().__init__(self._render())

    def _render(self) -> str:
        how = self.outcome or describe_exit(self.exit_code)
        lines = [f"Rank {self.rank} {self.reason} ({how})" if self.reason
                 else f"Rank {self.rank} failed ({how})"]
        if self.exc_type:
            lines[0] += f": {self.exc_type}: {self.exc_message}"
        if self.traceback:
            lines += ["", f"Traceback from rank {self.rank}:"]
            lines += fold_frames(self.traceback.rstrip().split("\n"))
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
             self.output_tail, self.other_failures, self.reason, self.outcome),
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
