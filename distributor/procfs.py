"""What Linux's ``/proc/PID/stat`` says of a process on this host: one parser for the engine and
the runtimes above it (a stopped rank, a zombie, a process's session)."""
from __future__ import annotations

import os
from typing import List, Optional


def stat_fields(pid: int) -> Optional[List[bytes]]:
    """The fields of ``/proc/PID/stat`` after the command name: state, ppid, pgrp, session, ...
    (``proc(5)`` fields 3 and on); None if it cannot be read (the process is gone, no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None


def state(pid: int) -> Optional[str]:
    """The state letter of process `pid` (``R``, ``S``, ``T`` stopped, ``t`` traced, ``Z``...),
    None if unknown."""
    fields = stat_fields(pid)
    return fields[0].decode(errors="replace") if fields else None


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP) or stopped by a debugger."""
    return state(pid) in ("T", "t")


def alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie not yet reaped counts as exited);
    where ``/proc`` cannot say, whether a signal can find it (another user's process is alive)."""
    current = state(pid)
    if current is not None:
        return current not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
