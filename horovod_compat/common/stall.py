"""The stall inspector (Horovod's ``HOROVOD_STALL_CHECK_TIME_SECONDS`` warnings).

``HOROVOD_STALL_CHECK_TIME_SECONDS`` (default 60), ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (default
0 = never), ``HOROVOD_STALL_CHECK_DISABLE=1``.  A daemon thread per rank: every tick, a rank with an
op older than the check time prints which ranks are missing which tensors.  After the shutdown time
it prints an error and ends the process (exit code 1) so the launcher stops the job.

What it knows comes from the coordinators: the ``inflight`` tables (every op of every transport is
there from submission to result), what every peer announced in the negotiation rounds so far
(``SetState.announced``), and, for the round in progress (which completes only once every rank
took part, so a late rank hides what the others sent in it), each rank's *post*: every tick, a
rank with an op in flight for a while posts the names of its ops in flight on its process set's
beat channel (``liveness.Watch.post``: the set's shared segment on one host, its mesh's beat
connections across hosts).  A rank is missing an op when neither says it submitted it.  Nothing
goes through the job's c10d store, so the inspector never blocks on the rank that serves it (rank
0) being stopped or gone; a peer that is *frozen* rather than late is ``liveness``'s to report.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

__all__ = ["StallInspector", "start"]


class StallInspector(threading.Thread):
    """The inspector thread of one init generation; ``sets()`` yields the live coordinators."""

    def __init__(self, store: Any, rank: int, check: float, shutdown: float,
                 sets: Callable[[], Iterable[Any]]) -> None:
        super().__init__(name="horovod_compat-stall-inspector", daemon=True)
        self.rank = rank
        self.check = check
        self.shutdown = shutdown
        self.tick = max(0.2, min(check / 4.0, 2.0))
        self.stop_event = threading.Event()
        self.warned: Dict[str, float] = {}
        self.sets = sets
        # a rank posts once an op has waited this long; a post older than ``fresh`` is stale
        self.post_after = min(check / 2.0, 1.0)
        self.fresh = 3 * self.tick + 1.0
        self.posted: "weakref.WeakSet[Any]" = weakref.WeakSet()  # sets with a non-empty post

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)

    def run(self) -> None:
        while not self.stop_event.wait(self.tick):
            try:
                self._inspect()
            except Exception:  # the inspector must never take a healthy job down
                pass

    def _inspect(self) -> None:
        now = time.monotonic()
        stalled: Dict[str, Tuple[float, Any]] = {}
        for st in self.sets():
            if st is None:
                continue
            ops = sorted(list(st.inflight.items()), key=lambda item: item[1])
            self._post(st, ops, now)
            for name, t0 in ops:
                if now - t0 > self.check:
                    stalled[name] = (now - t0, st)
        if not stalled:
            return
        missing: Dict[int, List[str]] = {}
        worst = 0.0  # age of the oldest op that some rank has really not submitted
        for name, (age, st) in stalled.items():
            for r in _missing(st, name, self.fresh):
                missing.setdefault(r, []).append(name)
                worst = max(worst, age)
        new = [n for n in stalled if n not in self.warned]
        if new and missing:
            lines = "\n".join(f"{r}: [{', '.join(sorted(ns))}]" for r, ns in sorted(missing.items()))
            msg = (f"[horovod_compat rank {self.rank}] One or more tensors were submitted to be "
                   "reduced, gathered or broadcasted by subset of ranks and are waiting for "
                   f"remainder of ranks for more than {int(self.check)} seconds. This may indicate "
                   "that different ranks are trying to submit different tensors or that only "
                   "subset of ranks is submitting tensors, which will cause deadlock. \n"
                   f"Missing ranks:\n{lines}")
            print(msg, file=sys.stderr, flush=True)
            for n in new:
                self.warned[n] = time.monotonic()
        if self.shutdown > 0 and worst > max(self.shutdown, self.check):
            print(f"[horovod_compat rank {self.rank}] HorovodInternalError: stall shutdown time "
                  f"({self.shutdown:g} s, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS) exceeded waiting for "
                  f"{sorted(stalled)} (missing ranks: {sorted(missing)}); shutting down",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)

    def _post(self, st: Any, ops: List[Tuple[str, float]], now: float) -> None:
        """Post this rank's ops in flight in set ``st`` while one has waited a while; an empty
        post once they are done."""
        watch = getattr(st, "watch", None)
        if watch is None or not watch.posts:
            return
        if ops and now - ops[0][1] > self.post_after:
            watch.post([name for name, _t0 in ops])
            self.posted.add(st)
        elif st in self.posted:
            watch.post([])
            self.posted.discard(st)


def _missing(st: Any, name: str, fresh: float) -> List[int]:
    """The global ranks of set ``st`` that have not submitted this rank's op ``name``: neither
    announced in a round so far nor listed in a post younger than ``fresh`` seconds (an op that
    is already running or done has none)."""
    others = [r for r in range(st.n) if r != st.me and not st.joined[r]]
    if name == "join":
        return [st.ranks[r] for r in others]
    key = None
    with st.lock:
        for k, p in list(st.mine.items()):
            if p.plan.name == name:
                key = k
                break
        else:
            for p in list(st.fresh):
                if p.plan.name == name:
                    key = p.key
                    break
    if key is None:
        return []
    watch = getattr(st, "watch", None)
    out = []
    for r in others:
        if key in st.announced[r]:
            continue
        post = watch.posted(r) if watch is not None else None
        if post is not None and post[0] <= fresh and name in post[1]:
            continue
        out.append(st.ranks[r])
    return out


def start(store: Any, rank: int, size: int, sets: Callable[[], Iterable[Any]]) -> Optional[StallInspector]:
    """Start the inspector for an init generation (None when disabled or useless).  ``store`` is
    not used (kept for the callers): nothing the inspector does goes through the job's store."""
    if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "0") not in ("", "0"):
        return None
    if size <= 1:
        return None
    check = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "60"))
    shutdown = float(os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0"))
    inspector = StallInspector(store, rank, check, shutdown, sets)
    inspector.start()
    return inspector
