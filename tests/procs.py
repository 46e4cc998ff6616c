"""Test helper: the live processes of a job, found by a marker in their environment.

A test puts a unique ``KEY=VALUE`` into the environment of what it launches; every process the
launch starts inherits it (launchers, ranks, ``mpirun`` and ``prted``, fork servers), so the
processes that outlived a job are the live ones whose ``/proc/PID/environ`` still holds it.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Dict, Iterable, List, Set, Tuple

from distributor import procfs


alive = procfs.alive  # whether a process exists and is not a zombie


def _with(needle: str, warm_servers: bool) -> List[int]:
    raw = needle.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env:
                if raw not in env.read():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if (WARM_SERVER in cmdline.read().split(b"\0")) is not warm_servers:
                    continue
        except OSError:
            continue
        if alive(int(entry)):
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    """The command line of process `pid`, its words joined by spaces ("" if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent(pid: int) -> int:
    """The parent of process `pid` (0 if it is gone)."""
    fields = procfs.stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else 0


def ancestors(pid: int) -> List[int]:
    """The processes above `pid`, its parent first, up to (not including) pid 1."""
    found = []
    pid = parent(pid)
    while pid > 1:
        found.append(pid)
        pid = parent(pid)
    return found


def commands(pids: List[int]) -> Dict[int, str]:
    """{pid: command line} of those of `pids` still there (what a failure report names)."""
    return {pid: line.strip() for pid in pids if (line := cmdline(pid))}


#: The command-line word of a warm fork server (distributor/forkserver_daemon.py), which stays
#: after the launch that started it, by design, until it has been idle for a while.
WARM_SERVER = b"distributor.forkserver_daemon"


def processes_with(needle: str) -> List[int]:
    """PIDs of live (not zombie) processes, this one and warm fork servers excepted, whose
    environment contains `needle` (e.g. ``"MY_TEST_MARKER=1f3a..."``). A rank forked by a warm
    server shows the server's environment: the server's is the launch's when the launch started
    it, as a launch with a marker of its own does."""
    return _with(needle, warm_servers=False)


def ranks_with(needle: str) -> List[int]:
    """`processes_with(needle)` but Spark executors' fork servers: a reused Python worker keeps
    its server (started with the environment of the job that started it) for the next job."""
    return [pid for pid in processes_with(needle) if "distributor.forkserver " not in cmdline(pid) + " "]


def ranks_left_after(needle: str, timeout: float = 30.0) -> List[int]:
    """`ranks_with(needle)` still alive after waiting up to `timeout` s for them to go (no wait
    once they are gone): what a job left behind when it ended."""
    deadline = time.monotonic() + timeout
    while (left := ranks_with(needle)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def stop_warm_servers(needle: str) -> None:
    """SIGTERM, by PID, the warm fork servers whose environment contains `needle` (their ranks
    die with them), and wait up to 10 s for them to go."""
    _terminate(_with(needle, warm_servers=True))


def left_after(needle: str, timeout: float = 15.0) -> List[int]:
    """The processes with `needle` still alive after waiting up to `timeout` s for them to go;
    then the warm fork servers with `needle` (started by the launch, which stay by design) are
    stopped."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_with(needle)
        if not left or time.monotonic() > deadline:
            stop_warm_servers(needle)
            return left
        time.sleep(0.2)


def sigkill(pids: List[int], sig: int = signal.SIGKILL) -> None:
    """SIGKILL (or `sig`) each of `pids` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_warm_servers_in(directory: str) -> None:
    """SIGTERM, by the PIDs of their pid files, the warm fork servers whose private directory is
    `directory` (distributor.forkserver_daemon), and wait up to 10 s for them to go."""
    from distributor.forkserver_daemon import server_pids

    _terminate(server_pids(directory))


def _terminate(pids: List[int]) -> None:
    """SIGTERM each of `pids` that still exists; wait up to 10 s for them to go."""
    sigkill(pids, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def listening(pids: Iterable[int]) -> Set[Tuple[int, int]]:
    """(pid, port) of each TCP socket (IPv4 or IPv6) in the LISTEN state that one of `pids` holds
    open, from ``/proc/net/tcp*`` (this network namespace) and ``/proc/PID/fd``."""
    ports: Dict[str, int] = {}  # socket inode -> local port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A":  # TCP_LISTEN
                ports[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in ports:
                found.add((pid, ports[target[8:-1]]))
    return found
