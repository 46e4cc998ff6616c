"""The stall inspector (Horovod's ``HOROVOD_STALL_CHECK_TIME_SECONDS`` warnings).

``HOROVOD_STALL_CHECK_TIME_SECONDS`` (default 60), ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (default
0 = never), ``HOROVOD_STALL_CHECK_DISABLE=1``.  A daemon thread per rank: every tick, a rank with an
op older than the check time posts its pending tensor names to the job's rendezvous store, reads the
other ranks' posts and prints which ranks are missing which tensors.  After the shutdown time it
prints an error and ends the process (exit code 1) so the launcher stops the job.  It reads the
coordinators' ``inflight`` tables (every op of every transport is there from submission to result).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

__all__ = ["StallInspector", "start"]


class StallInspector(threading.Thread):
    """The inspector thread of one init generation; ``sets()`` yields the live coordinators."""

    def __init__(self, store: Any, rank: int, check: float, shutdown: float,
                 sets: Callable[[], Iterable[Any]]) -> None:
        super().__init__(name="horovod_compat-stall-inspector", daemon=True)
        self.store = store
        self.rank = rank
        self.check = check
        self.shutdown = shutdown
        self.tick = max(0.2, min(check / 4.0, 2.0))
        self.stop_event = threading.Event()
        self.warned: Dict[str, float] = {}
        self.posted = False
        self.sets = sets

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
        coordinators = [st for st in self.sets() if st is not None]
        stalled: Dict[str, Tuple[float, Any]] = {}
        mine: List[str] = []
        for st in coordinators:
            for name, t0 in list(st.inflight.items()):
                mine.append(name)
                if now - t0 > self.check:
                    stalled[name] = (now - t0, st)
        if mine and (stalled or any(now - t0 > self.check / 2 for st in coordinators
                                    for t0 in list(st.inflight.values()))):
            self.store.set(f"stall/{self.rank}", json.dumps([time.time(), sorted(mine)]))
            self.posted = True
        elif self.posted:
            self.store.set(f"stall/{self.rank}", json.dumps([time.time(), []]))
            self.posted = False
        if not stalled:
            return
        missing: Dict[int, List[str]] = {}
        worst = 0.0  # age of the oldest op that some rank has really not submitted
        posted: Dict[int, List[str]] = {}
        for name, (age, st) in stalled.items():
            for r in st.ranks:
                if r == self.rank:
                    continue
                if r not in posted:
                    posted[r] = self._posted_names(r)
                if name not in posted[r]:
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
                  f"{sorted(stalled)}; shutting down", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)

    def _posted_names(self, r: int) -> List[str]:
        key = f"stall/{r}"
        if not self.store.check([key]):
            return []
        t, names = json.loads(self.store.get(key).decode())
        if time.time() - t > 3 * self.tick + 1.0:
            return []
        return names


def start(store: Any, rank: int, size: int, sets: Callable[[], Iterable[Any]]) -> Optional[StallInspector]:
    """Start the inspector for an init generation (None when disabled or useless)."""
    if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "0") not in ("", "0"):
        return None
    if size <= 1 or store is None:
        return None
    check = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "60"))
    shutdown = float(os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0"))
    inspector = StallInspector(store, rank, check, shutdown, sets)
    inspector.start()
    return inspector
