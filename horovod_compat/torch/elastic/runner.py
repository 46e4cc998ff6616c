"""``hvd.elastic.run``: retry the training function from the last commit when a collective fails."""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, TypeVar

from .. import lifecycle
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["run"]

log = logging.getLogger("horovod_compat.elastic")
F = TypeVar("F", bound=Callable[..., Any])


def _reset() -> None:
    """Re-initialize Horovod (fresh process groups) after a failed collective."""
    if lifecycle.is_initialized():
        lifecycle.shutdown()
        lifecycle.init()


def run(func: F) -> F:
    """Decorator: ``func(state, *args, **kwargs)`` runs with elastic semantics.

    Before the first attempt every rank takes rank 0's state (``state.sync()``).  When
    ``HorovodInternalError`` escapes ``func`` (a collective failed), the state is restored to the last
    ``state.commit()``, Horovod is re-initialized, ``state.on_reset()`` runs the reset callbacks, the
    state is synced again and ``func`` is called again.  ``HostsUpdatedInterrupt`` skips the restore.
    At most ``HOROVOD_ELASTIC_RESET_LIMIT`` resets (unlimited when unset, like Horovod).
    """
    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        limit_env = os.environ.get("HOROVOD_ELASTIC_RESET_LIMIT", "")
        limit = int(limit_env) if limit_env.strip() else None
        resets = 0
        skip_sync = False
        while True:
            if not skip_sync:
                state.sync()
            try:
                return func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                log.warning("collective failed (%s): restoring the last commit and retrying", exc)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = bool(getattr(exc, "skip_sync", False))
            resets += 1
            if limit is not None and resets > limit:
                raise RuntimeError(f"hvd.elastic.run: reset limit ({limit}) reached")
            _reset()
            state.on_reset()
    return wrapper  # type: ignore[return-value]
