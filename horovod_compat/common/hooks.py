"""The single instrumentation point every collective passes through.

Why: the timeline (``HOROVOD_TIMELINE`` / ``hvd.start_timeline``, a later issue) and any other
observer need the same four moments for every collective, per tensor name:

``NEGOTIATE_START``  the op was submitted on this rank and cross-rank negotiation began;
``ALL_READY``        negotiation finished: every rank submitted a matching op;
``OP_START``         the data transfer was launched (``info``: ``kind``, ``dtype``, ``shape``, ``op``);
``OP_END``           the result is available on this rank (``info`` may carry ``error``).

Optional, for finer timelines (Horovod's nested activities):

``ALL_READY`` may carry ``ready_us`` (wall-clock µs, ``time.time_ns() // 1000``, at which each rank
of the set submitted the op) and ``ranks`` (their global ranks): the timeline then draws one
readiness tick per rank, as Horovod does.
``ACTIVITY_START``   a phase of the op began (``info``: ``activity``, e.g. ``"MEMCPY_OUT_FUSION_BUFFER"``);
``ACTIVITY_END``     the innermost open phase of that tensor's op ended.
``STEP``             a training step ended: ``DistributedOptimizer.synchronize()`` reduced every
                     gradient of it (name: the optimizer's, ``info``: ``step``, ``optimizer``);
                     the timeline marks it, other listeners may ignore it.

The hot path pays a single attribute read when nobody listens: collectives test ``hooks.active``
before building any event.  Listeners are called synchronously on the rank's calling thread and must
be cheap; an exception in a listener is reported once as a warning and the listener is dropped so a
broken observer never breaks training.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, List

__all__ = ["NEGOTIATE_START", "ALL_READY", "OP_START", "OP_END", "ACTIVITY_START", "ACTIVITY_END", "STEP",
           "subscribe", "unsubscribe", "emit", "active"]

NEGOTIATE_START = "NEGOTIATE_START"
ALL_READY = "ALL_READY"
OP_START = "OP_START"
OP_END = "OP_END"
ACTIVITY_START = "ACTIVITY_START"
ACTIVITY_END = "ACTIVITY_END"
STEP = "STEP"

Listener = Callable[[str, str, dict], Any]

#: True when at least one listener is subscribed; read by collectives before calling ``emit``.
active: bool = False
_listeners: List[Listener] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> None:
    """Call ``listener(event, tensor_name, info)`` for every collective event from now on."""
    global active
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)
        active = True


def unsubscribe(listener: Listener) -> None:
    """Stop calling ``listener``; a no-op if it was not subscribed."""
    global active
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)
        active = bool(_listeners)


def emit(event: str, name: str, **info: Any) -> None:
    """Deliver one event to every listener (callers check ``hooks.active`` first)."""
    for listener in list(_listeners):
        try:
            listener(event, name, info)
        except Exception as exc:  # a broken observer must not break training
            warnings.warn(f"horovod_compat hook listener {listener!r} failed and was removed: {exc!r}")
            unsubscribe(listener)
