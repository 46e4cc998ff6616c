"""``horovod.common.elastic``: the framework-independent part of Horovod's elastic API, shared by
every binding -- the ``State`` base with host-change notices, ``ObjectState``, and the elastic loop
``run`` / ``run_fn``.  Each binding adds its own states (``TorchState``; ``TensorFlowKerasState``).

``run``: each attempt syncs the state from rank 0 (unless skipped) and calls the function.  When it raises
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

import copy
import functools
import logging
import os
import queue
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from distributor import worker
from distributor.elastic.world import HostUpdate

from . import lifecycle
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .objects import broadcast_object

__all__ = ["State", "ObjectState", "run", "run_fn"]

log = logging.getLogger("horovod_compat.elastic")
#: Identical collective failures, with no commit between them, after which ``run`` gives up.
REPEATS_WITHOUT_PROGRESS = 3
F = TypeVar("F", bound=Callable[..., Any])


class State:
    """Base of elastic states (Horovod's ``horovod.common.elastic.State``).

    ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank; ``get_rank()`` this rank.
    """

    def __init__(self, bcast_object: Callable[[Any], Any] = broadcast_object,
                 get_rank: Callable[[], int] = lifecycle.rank) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: "queue.Queue[Tuple[float, HostUpdate]]" = queue.Queue()
        self._last_updated_timestamp: float = 0
        self._reset_callbacks: List[Callable[[], None]] = []
        #: commits made so far (``hvd.elastic.run`` tells progress from a failure loop by it)
        self.commits = 0

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called (in order) after every reset, e.g. to rescale the learning rate to the
        new number of workers."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After a reset (new world): forget the host notices about earlier rounds, ``reset()``,
        run the callbacks.

        A notice is about an earlier round when the driver stamped it before the new round
        formed (``worker.round_formed_at()``, same clock). One stamped later stays: it can reach
        this rank between the round's forming and this call (a replacement that joined at once),
        and dropping it would leave the newcomer waiting while this round trains without it."""
        self._last_updated_timestamp = max(self._last_updated_timestamp, worker.round_formed_at())
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: Any = HostUpdate.NO_UPDATE) -> None:
        """The driver announced a host change (called from the link's thread)."""
        self._host_messages.put((timestamp, HostUpdate(int(update_res))))

    def commit(self) -> None:
        """Save the state (the point a failure rolls back to), then ``check_host_updates()``."""
        self.save()
        self.commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank at once if hosts changed.

        Each rank folds the notices it received since the last check; rank 0's view (previous
        timestamp, newest timestamp, union of the changes) is broadcast, so all ranks decide alike
        even when a notice reached some of them a moment later.  ``skip_sync`` is True when hosts
        were only removed (the survivors' state is already equal)."""
        prev = last = self._last_updated_timestamp
        update = HostUpdate.NO_UPDATE
        while True:
            try:
                timestamp, res = self._host_messages.get_nowait()
            except queue.Empty:
                break
            if timestamp > last:
                last = timestamp
                update |= res
        prev, self._last_updated_timestamp, update = self._bcast_object((prev, last, int(update)))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(HostUpdate(update) == HostUpdate.REMOVED)

    def save(self) -> None:
        """Save the state in host memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Bring back the last saved state, undoing what changed since."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Make every rank's state equal to rank 0's."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Adjust to a new world after a reset, before ``sync()`` (nothing by default)."""


class ObjectState(State):
    """Picklable attributes given as keyword arguments (``ObjectState(epoch=0, batch=0)``)."""

    def __init__(self, bcast_object: Callable[[Any], Any] = broadcast_object,
                 get_rank: Callable[[], int] = lifecycle.rank, **kwargs: Any) -> None:
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def _set_attrs(self) -> None:
        # copies: changing an attribute in place must not change the committed value
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))

    def save(self) -> None:
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()


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
                    if elastic and exc.frozen and exc.peer is not None:
                        # the next round would wait for it (its heartbeat goes on while it is
                        # hung in native code; a stopped one is found only after minutes)
                        worker.report_frozen(exc.peer, str(exc))
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
