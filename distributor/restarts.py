"""Restart-all, as torchrun's ``--max-restarts``: when a job fails, run the whole job again.

A failure of any rank (an exception, an exit, a signal, a timeout, a lost Spark task) has already
stopped every rank when the engine reports it; with `LaunchRequest.max_restarts=N` the job is then
started again from the beginning, with fresh processes (on Spark: a new barrier stage), up to N
times. Nothing survives from one attempt to the next but what the training code saved itself (its
checkpoint files), exactly as under torchrun; every rank sees TORCHELASTIC_RESTART_COUNT (0 on the
first attempt, k on the k-th restart) and TORCHELASTIC_MAX_RESTARTS=N to find out.

What cannot succeed on a second attempt is not retried: a `LaunchValidationError` (the request
is wrong; raised before any process starts) and a return value that cannot be pickled. When every
attempt failed, the last failure is raised, its message listing every attempt and its cause, and
its `attempts` attribute holding them as `Attempt` records.

This is not the elastic mode (`LaunchRequest.elastic`), where only the failed worker is replaced
and the others keep their memory.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, List

from .elastic.policy import Attempt
from .errors import DistributedRunError, LaunchValidationError, RankFailedError
from .spec import LaunchRequest, OutputHandler

RESTART_COUNT_VAR = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS_VAR = "TORCHELASTIC_MAX_RESTARTS"

#: Exception types (as a rank reports them) that the same code and data would raise again.
_NOT_RETRIED_IN_RANKS = ("PayloadPicklingError",)


def retried(error: BaseException) -> bool:
    """True for a failure that another run of the whole job may not repeat."""
    if not isinstance(error, DistributedRunError) or isinstance(error, LaunchValidationError):
        return False
    return not (isinstance(error, RankFailedError) and error.exc_type in _NOT_RETRIED_IN_RANKS)


def run_with_restarts(request: LaunchRequest, run_once: Callable[[LaunchRequest], Any],
                      output: OutputHandler) -> Any:
    """Call `run_once` with `request` (its env telling the attempt number) until one attempt
    succeeds or `request.max_restarts` restarts have failed too; return its value. Each restart
    is announced as a launcher line (rank None) on `output`, where the ranks' lines go."""
    limit = request.max_restarts
    attempts: List[Attempt] = []
    count = 0
    while True:
        env = {**request.env, RESTART_COUNT_VAR: str(count), MAX_RESTARTS_VAR: str(limit)}
        try:
            return run_once(dataclasses.replace(request, env=env))
        except BaseException as error:
            if not retried(error):
                raise
            action = (f"gave up (max_restarts={limit} used)" if count == limit
                      else f"restarted every rank (restart {count + 1} of {limit})")
            attempts.append(Attempt(count + 1, time.time(), _first_line(error), action))
            if count == limit:
                raise _exhausted(error, attempts) from None
            output(None, "stderr", f"attempt {count + 1} of {limit + 1} failed: "
                                   f"{attempts[-1].cause}; restarting every rank")
        count += 1


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0]


def _exhausted(error: BaseException, attempts: List[Attempt]) -> BaseException:
    """`error` (the last failure, its type and attributes kept) with a message listing every
    attempt, and the list itself as `error.attempts`."""
    total = len(attempts)
    lines = [f"The job failed {total} time(s): every attempt allowed by max_restarts={total - 1} "
             "failed (each restart ran every rank again from the start)."]
    lines += [f"  attempt {a.number} of {total}: {a.cause}" for a in attempts]
    lines += ["", "The last attempt's failure:", str(error)]
    error.attempts = list(attempts)  # type: ignore[attr-defined]
    error.args = ("\n".join(lines),)
    return error
