"""Test helper: the live processes of a job, found by a marker in their environment.

A test puts a unique ``KEY=VALUE`` into the environment of what it launches; every process the
launch starts inherits it (launchers, ranks, ``mpirun`` and ``prted``, fork servers), so the
processes that outlived a job are the live ones whose ``/proc/PID/environ`` still holds it.
"""
from __future__ import annotations

import os
import signal
import time
from typing import List


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def processes_with(needle: str) -> List[int]:
    """PIDs of live (not zombie) processes, this one excepted, whose environment contains
    `needle` (e.g. ``"MY_TEST_MARKER=1f3a..."``)."""
    raw = needle.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env:
                if raw not in env.read():
                    continue
        except OSError:
            continue
        if alive(int(entry)):
            found.append(int(entry))
    return found


def left_after(needle: str, timeout: float = 15.0) -> List[int]:
    """The processes with `needle` still alive after waiting up to `timeout` s for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_with(needle)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def sigkill(pids: List[int]) -> None:
    """SIGKILL each of `pids` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
