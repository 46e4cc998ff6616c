"""The life cycle of one worker (a rank process) as the driver sees it.

```
             HELLO (proved the secret, got its payload)
  STARTING ───────────────────────────────────────────▶ RUNNING ──result + exit 0──▶ SUCCEEDED
     │                                                  │  ▲  │
     │ exit / no HELLO in time                    JOIN  │  │  │ error, non-zero exit, signal,
     ▼                                                  ▼  │  │ lost connection or heartbeat
   FAILED ◀───────────────────────────────────────── WAITING  └──────────────────────▶ FAILED
                                                  (elastic: between    WORLD sent: RUNNING
                                                   two rounds)
  any state but SUCCEEDED/FAILED ──driver stops it──▶ STOPPED
```

`WAITING` exists only in elastic jobs: the worker left its round's world (a peer failed, or hosts
changed) and waits for the next round. A fixed-size job ends at the first `FAILED` worker; an
elastic job replaces it (see `distributor.elastic`). `SUCCEEDED`, `FAILED` and `STOPPED` are
final: a worker never leaves them, a replacement is a new worker.
"""
from __future__ import annotations

import enum
from typing import Dict, FrozenSet


class WorkerState(enum.Enum):
    STARTING = "starting"    # process spawned, has not proved the job secret yet
    RUNNING = "running"      # connected, received its payload, runs user code
    WAITING = "waiting"      # elastic: sent JOIN, waits for the next round's world
    SUCCEEDED = "succeeded"  # reported its result and exited 0
    FAILED = "failed"        # raised, exited non-zero, was killed, or its host went silent
    STOPPED = "stopped"      # ended by the driver (another worker failed, timeout, job over)

    @property
    def final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED})

#: Every allowed transition; anything else is a bug in the driver.
TRANSITIONS: Dict[WorkerState, FrozenSet[WorkerState]] = {
    WorkerState.STARTING: frozenset({WorkerState.RUNNING, WorkerState.FAILED, WorkerState.STOPPED}),
    WorkerState.RUNNING: frozenset({WorkerState.WAITING, WorkerState.SUCCEEDED, WorkerState.FAILED,
                                    WorkerState.STOPPED}),
    WorkerState.WAITING: frozenset({WorkerState.RUNNING, WorkerState.FAILED, WorkerState.STOPPED}),
    WorkerState.SUCCEEDED: frozenset(),
    WorkerState.FAILED: frozenset(),
    WorkerState.STOPPED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """The driver tried a transition `TRANSITIONS` does not allow."""


def check_transition(current: WorkerState, new: WorkerState) -> WorkerState:
    """Return `new` if a worker in `current` may move to it; raise `IllegalTransition` otherwise."""
    if new is not current and new not in TRANSITIONS[current]:
        raise IllegalTransition(f"a worker cannot go from {current.name} to {new.name}")
    return new
