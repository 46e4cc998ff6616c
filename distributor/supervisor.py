"""Starting rank processes on this host and pumping their output, line by line.

The supervisor reads each rank's stdout and stderr pipes itself, so every line a rank writes —
from Python or from native code — is captured even if the rank dies right after writing it: the
pipe keeps the bytes, and the exit is reported only after both pipes have been read to the end.
On the driver (local placement) the events go straight to the engine; inside a Spark task they
are forwarded to the driver hub.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from . import procfs

log = logging.getLogger(__name__)

#: Maps (stream, line) of a multi-rank process to (rank or None for the launcher, stream, text).
Demux = Callable[[str, str], Tuple[Optional[int], str, str]]
#: Maps (rank, the multi-rank process's exit status) to that rank's own exit status.
ExitStatus = Callable[[int, int], int]


class RankEventSink(Protocol):
    """Where the supervisor reports what its ranks do."""

    def on_output(self, rank: Optional[int], stream: str, line: str) -> None: ...

    def on_exit(self, rank: int, returncode: int) -> None: ...


class Process(Protocol):
    """What the supervisor uses of a rank process: `subprocess.Popen`'s pid, stdout and stderr
    pipes, poll() and wait(timeout) (raising `subprocess.TimeoutExpired`). A process on another
    machine (`placement.ray.RayRankProcess`) also has ``signal_group(sig)``: its signals go
    through that, never to a local process group with its pid."""

    pid: int
    stdout: IO[bytes]
    stderr: IO[bytes]

    def poll(self) -> Optional[int]: ...

    def wait(self, timeout: Optional[float] = None) -> int: ...


@dataclass
class _RankProcess:
    rank: int
    popen: Process
    pumps: List[threading.Thread] = field(default_factory=list)
    group: Tuple[int, ...] = ()  # every rank this process runs, when it runs several
    on_exit: Optional[Callable[[int], None]] = None  # called with its pid once it has exited
    exit_status: Optional[ExitStatus] = None  # each rank's status, when it runs several


class Supervisor:
    """Owns the rank processes of one host: start, watch, stop."""

    def __init__(self, sink: RankEventSink) -> None:
        self._sink = sink
        self._procs: Dict[int, _RankProcess] = {}
        self._lock = threading.Lock()

    def start(self, rank: int, argv: Sequence[str], env: Mapping[str, str], cwd: Optional[str] = None) -> int:
        """Start one rank process in its own session; return its PID."""
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        return self.track(rank, popen)

    def track(self, rank: int, popen: "Process") -> int:
        """Watch a rank process started elsewhere (in its own session, output on `popen`'s
        stdout/stderr pipes), e.g. forked by a `forkserver.ForkServer`; return its PID."""
        proc = _RankProcess(rank, popen)
        for stream, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            pump = threading.Thread(
                target=self._pump, args=(rank, stream, pipe), name=f"rank{rank}-{stream}", daemon=True
            )
            pump.start()
            proc.pumps.append(pump)
        with self._lock:
            self._procs[rank] = proc
        threading.Thread(target=self._wait, args=(proc,), name=f"rank{rank}-wait", daemon=True).start()
        return popen.pid

    def start_group(
        self, ranks: Sequence[int], argv: Sequence[str], env: Mapping[str, str], demux: "Demux",
        on_exit: Optional[Callable[[int], None]] = None, exit_status: Optional[ExitStatus] = None,
    ) -> int:
        """Start one process that runs several ranks (e.g. `mpirun`) and tags their output.

        `demux` maps each output line to (rank, stream, text); rank None marks a line of the
        launcher itself. When the process exits, `on_exit` is called with its pid (e.g. to remove
        what the process leaves behind when it is killed), then every rank of the group is
        reported as exited with the process's status, or with what `exit_status` makes of it
        for that rank (the launcher said how the rank ended).
        """
        popen = subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )
        proc = _RankProcess(ranks[0], popen, group=tuple(ranks), on_exit=on_exit,
                            exit_status=exit_status)
        for stream, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            pump = threading.Thread(
                target=self._pump, args=(None, stream, pipe, demux), name=f"group-{stream}", daemon=True
            )
            pump.start()
            proc.pumps.append(pump)
        with self._lock:
            self._procs[ranks[0]] = proc
        threading.Thread(target=self._wait, args=(proc,), name="group-wait", daemon=True).start()
        return popen.pid

    def _pump(self, rank: Optional[int], stream: str, pipe: IO[bytes], demux: Optional["Demux"] = None) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                if line.endswith("\n"):
                    line = line[:-2] if line.endswith("\r\n") else line[:-1]
                if demux is None:
                    self._sink.on_output(rank, stream, line)
                else:
                    self._sink.on_output(*demux(stream, line))

    def _wait(self, proc: _RankProcess) -> None:
        returncode = proc.popen.wait()
        for pump in proc.pumps:
            # Pipes stay open while a grandchild holds them; don't let one block the report.
            pump.join(timeout=None if returncode == 0 else 5.0)
        if proc.on_exit is not None:
            try:
                proc.on_exit(proc.popen.pid)
            except Exception:  # noqa: BLE001 - the exit is reported whatever the clean-up did
                log.exception("clean-up after the exit of rank %s's process failed", proc.rank)
        for rank in proc.group or (proc.rank,):
            self._sink.on_exit(rank, returncode if proc.exit_status is None
                               else proc.exit_status(rank, returncode))

    def pids(self) -> Dict[int, int]:
        with self._lock:
            return {rank: proc.popen.pid for rank, proc in self._procs.items()}

    def stop(self, ranks: Optional[Sequence[int]] = None, grace: float = 3.0) -> None:
        """SIGTERM the ranks' process groups, then SIGKILL whatever is left after `grace`. SIGCONT
        follows the SIGTERM: a stopped (SIGSTOPped, frozen) process would otherwise keep it pending
        for the whole grace."""
        with self._lock:
            procs = [p for r, p in self._procs.items() if ranks is None or r in ranks]
        running = [p for p in procs if p.popen.poll() is None]
        for proc in running:
            _signal(proc.popen, signal.SIGTERM)
            _signal(proc.popen, signal.SIGCONT)
        deadline = time.monotonic() + grace
        for proc in running:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            _signal(proc.popen, signal.SIGKILL)  # also reaps children left in the group
        # and those that moved to a process group of their own in its session, such as mpirun's
        # ssh to a host that no longer answers (it would wait for that host for hours)
        _kill_sessions({proc.popen.pid for proc in procs if not hasattr(proc.popen, "signal_group")})

    def wait_all(self, timeout: Optional[float] = None) -> None:
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            proc.popen.wait(timeout=timeout)


def _signal(popen: "Process", sig: int) -> None:
    """`sig` to the process group of `popen`: its own `signal_group` where it has one (a process
    on another machine), else this machine's."""
    send = getattr(popen, "signal_group", None)
    if send is not None:
        send(sig)
    else:
        _signal_group(popen.pid, sig)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_sessions(sids: Set[int]) -> None:
    """SIGKILL every process of the sessions `sids` (rank processes start sessions of their own)."""
    if not sids:
        return
    try:
        entries = os.listdir("/proc")
    except OSError:
        return  # no /proc: the process groups were all we could reach
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = procfs.stat_fields(int(entry))
        try:
            session = int(fields[3]) if fields else None
        except (IndexError, ValueError):
            continue
        if session in sids:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
