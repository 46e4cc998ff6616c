"""What user code (and front ends) inside a rank may use of the engine.

- `send_to_driver(obj)` delivers a picklable object to the driver's message handler (by default it
  is printed there as `[rank N] obj`); front ends use it for log callbacks such as sparkdl's
  `log_to_driver`.
- In an elastic job (`is_elastic()`): `join_world()` leaves the current round and blocks until the
  driver sends this worker's place in the next one; `add_hosts_listener(fn)` is called with every
  host change the driver announces; `lost_member(round)` names a member of a round that failed
  (the driver tells the others at once, so that a worker still joining that round stops waiting
  for it: `elastic.store.RoundStore`); `report_frozen(rank, message)` tells the driver that a
  member of this worker's round stopped responding, so that the driver replaces it rather than
  leave the next round waiting for it until its heartbeat times out.
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .elastic.world import HostUpdate, World
from .protocol import Channel, Kind

#: Set by the driver in the environment of every worker of an elastic job.
ELASTIC_VAR = "DISTRIBUTOR_ELASTIC"

_channel: Optional[Channel] = None
_rank: Optional[int] = None
_worlds: "queue.Queue[Optional[World]]" = queue.Queue()
_last_round = -1
_round_formed_at = 0.0
_listeners: List[Callable[[float, HostUpdate], None]] = []
#: (timestamp, update) of each host notice of the current round, replayed to a listener added
#: later: a notice can come before the program registers one (the round formed in its
#: ``hvd.init()``, a replacement asked to join before ``hvd.elastic.run`` started)
_notices: List[Tuple[float, HostUpdate]] = []
_lost: Dict[int, int] = {}  # round -> rank of its first member that failed (driver's LOST)
_lost_cv = threading.Condition()
_listeners_lock = threading.Lock()


def attach(channel: Channel, rank: int) -> None:
    """Called by the rank entry point once the rank is connected to the driver hub."""
    global _channel, _rank
    _channel, _rank = channel, rank


def worker_id() -> Optional[int]:
    """This worker's id (its rank in a fixed-size job; stable across rounds in an elastic job,
    where a replacement gets a new id), or None outside a rank."""
    return _rank


def in_rank() -> bool:
    """True inside a rank process started by this engine."""
    return _channel is not None


def send_to_driver(message: Any) -> None:
    """Send `message` to the driver now; raises RuntimeError outside a rank of this engine."""
    if _channel is None or _rank is None:
        raise RuntimeError(
            "send_to_driver works only inside a rank started by distributor "
            "(TorchDistributor, HorovodRunner or distributor.run_function)."
        )
    _channel.send(Kind.MESSAGE, (_rank, message))


# ---- elastic jobs ------------------------------------------------------------------------------
def is_elastic() -> bool:
    """True in a worker of an elastic job (its world comes from `join_world`, not the env)."""
    return _channel is not None and os.environ.get(ELASTIC_VAR) == "1"


def join_world(timeout: Optional[float] = None) -> World:
    """Leave the current round (if any) and wait for this worker's `World` in the next one.

    Raises `TimeoutError` after `timeout` seconds, and `ConnectionError` if the driver went away
    (the driver stops a worker it leaves out of a round: it never gets an answer it must ignore).
    """
    global _last_round, _round_formed_at
    if not is_elastic():
        raise RuntimeError("join_world works only in a worker of an elastic job")
    assert _channel is not None
    _channel.send(Kind.JOIN, _last_round)
    try:
        world = _worlds.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(
            f"no new round of the elastic job formed within {timeout:g}s: the driver is waiting "
            "for enough workers (min_np) or for the other workers to leave their round") from None
    if world is None:
        raise ConnectionError("the driver closed the connection while this worker waited for a round")
    _last_round, _round_formed_at = world.round, world.formed_at
    os.environ.update(world.torchrun_env())
    return world


def last_round() -> int:
    """The round this worker last joined (-1 before the first)."""
    return _last_round


def round_formed_at() -> float:
    """When (the driver's `time.time()`) the round this worker last joined formed; 0.0 before
    the first. A host notice stamped later is news to this round."""
    return _round_formed_at


def lost_member(round_number: int, wait: float = 0.0) -> Optional[int]:
    """The rank of a member of round `round_number` that failed (the driver's word), or None;
    waits up to `wait` seconds for the word (the driver sees a death a moment after its peers)."""
    with _lost_cv:
        _lost_cv.wait_for(lambda: round_number in _lost, timeout=wait)
        return _lost.get(round_number)


def report_frozen(rank: int, message: str) -> None:
    """Tell the driver that rank `rank` of this worker's current round stopped responding."""
    if is_elastic():
        assert _channel is not None
        _channel.send(Kind.FROZEN, (_last_round, int(rank), message))


def add_hosts_listener(fn: Callable[[float, HostUpdate], None]) -> None:
    """Call `fn(timestamp, update)` (from the link's thread) for every host change announced;
    at once (in this thread) for those announced to this worker's current round before."""
    with _listeners_lock:
        _listeners.append(fn)
        earlier = [n for n in _notices if n[0] >= _round_formed_at]
    for timestamp, update in earlier:
        fn(timestamp, update)


def remove_hosts_listener(fn: Callable[[float, HostUpdate], None]) -> None:
    with _listeners_lock:
        if fn in _listeners:
            _listeners.remove(fn)


def deliver(kind: Kind, body: Any) -> None:
    """Called by the rank entry point's link thread for WORLD, HOSTS_UPDATED and LOST frames."""
    if kind == Kind.WORLD:
        _worlds.put(body)
    elif kind == Kind.LOST:
        round_number, rank = body
        with _lost_cv:
            _lost.setdefault(int(round_number), int(rank))
            _lost_cv.notify_all()
    elif kind == Kind.HOSTS_UPDATED:
        timestamp, update = body
        with _listeners_lock:
            _notices[:] = [n for n in _notices if n[0] >= _round_formed_at]
            _notices.append((timestamp, HostUpdate(update)))
            listeners = list(_listeners)
        for fn in listeners:
            fn(timestamp, HostUpdate(update))


def link_closed() -> None:
    """Called by the rank entry point when its connection to the driver ends."""
    _worlds.put(None)
