"""``hvd.elastic.run``: Horovod's elastic loop around a training function.

Each attempt syncs the state from rank 0 (unless skipped) and calls the function.  When it raises
``HorovodInternalError`` (a collective failed: a peer died) the state goes back to the last commit;
when it raises ``HostsUpdatedInterrupt`` (hosts changed, seen at a commit) it does not.  Either way
Horovod is reset -- ``shutdown()`` then ``init()``, which in an elastic job is a re-join: this worker
gets its place in the driver's next round -- the state's ``on_reset()`` runs its callbacks, and the
function runs again.  A failure while re-joining or syncing counts as a failed collective too.

In an elastic job the driver enforces ``reset_limit``; in a fixed-size job (no driver that replaces
workers) ``HOROVOD_ELASTIC_RESET_LIMIT`` bounds the retries here. A collective that fails the same
way `REPEATS_WITHOUT_PROGRESS` times in a row with no commit in between is not a lost peer but a
mismatch that a reset cannot cure: it leaves ``run`` as a `RuntimeError` (the worker fails, and the
driver's rule for repeated errors ends the job with its traceback) instead of looping for ever.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Optional, TypeVar

from distributor import worker

from .. import lifecycle
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["run", "run_fn"]

log = logging.getLogger("horovod_compat.elastic")
#: Identical collective failures, with no commit between them, after which ``run`` gives up.
REPEATS_WITHOUT_PROGRESS = 3
F = TypeVar("F", bound=Callable[..., Any])


def _reset() -> None:
    """Leave the current world and join the next one (a fresh process group)."""
    lifecycle.shutdown()
    lifecycle.init()


def _local_reset_limit() -> Optional[int]:
    """``HOROVOD_ELASTIC_RESET_LIMIT`` in a fixed-size job; None (unlimited here) otherwise."""
    if worker.is_elastic():
        return None  # the driver counts resets over the whole job
    value = os.environ.get("HOROVOD_ELASTIC_RESET_LIMIT", "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"HOROVOD_ELASTIC_RESET_LIMIT={value!r} is not an integer; unset it or "
                         "give the number of resets allowed, e.g. 3") from None


def run(func: F) -> F:
    """Decorator: ``func(state, *args, **kwargs)`` runs with Horovod's elastic semantics.

    Do not run a collective in the code that calls the decorated function: a worker that joins
    later would meet it while the others sync their state.
    """
    return run_fn(func, _reset)


def run_fn(func: F, reset: Callable[[], None]) -> F:
    """``run`` with another reset than ``shutdown()`` + ``init()`` (Horovod's
    ``horovod.common.elastic.run_fn``)."""
    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        limit = _local_reset_limit()
        elastic = worker.is_elastic()
        listener = state.on_hosts_updated
        if elastic:
            worker.add_hosts_listener(listener)
        try:
            resets = 0
            reset_required = False
            skip_sync = False
            last_failure: Optional[tuple] = None  # (message, commits at that time)
            repeats = 0
            while True:
                try:
                    if reset_required:
                        reset()
                        state.on_reset()
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError as exc:
                    failure = (str(exc), getattr(state, "commits", None))
                    repeats = repeats + 1 if failure == last_failure else 1
                    last_failure = failure
                    if repeats >= REPEATS_WITHOUT_PROGRESS:
                        raise RuntimeError(
                            f"hvd.elastic.run: the same collective failure came {repeats} times in "
                            f"a row without a commit in between, so resetting does not cure it: "
                            f"{exc}") from exc
                    log.warning("hvd.elastic.run: %s; restoring the last commit and resetting", exc)
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as exc:
                    log.info("hvd.elastic.run: hosts changed; resetting")
                    skip_sync = bool(exc.skip_sync)
                resets += 1
                if limit is not None and resets > limit:
                    raise RuntimeError(
                        f"hvd.elastic.run: the reset limit HOROVOD_ELASTIC_RESET_LIMIT={limit} is "
                        f"reached ({resets} resets); raise it or unset it for no limit")
                reset_required = True
        finally:
            if elastic:
                worker.remove_hosts_listener(listener)
    return wrapper  # type: ignore[return-value]
