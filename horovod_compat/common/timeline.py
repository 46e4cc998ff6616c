"""``hvd.start_timeline`` / ``hvd.stop_timeline`` / ``HOROVOD_TIMELINE``: the adapter between the hvd
shim and the timeline recorder (``horovod_compat.timeline.writer``).

A ``Session`` is one process's recording, owned by the runtime of the ``init`` that started it
(``Runtime.timeline``); its ``State`` is one of OFF, RECORDING or PAUSED (below).  Transitions::

    OFF --start / init with HOROVOD_TIMELINE=<file>--> RECORDING --stop--> OFF
    RECORDING --shutdown, start_timeline recording--> OFF
    RECORDING --shutdown, env recording--> PAUSED --next init--> RECORDING (same file)

Horovod 0.28.1's behaviour, reproduced:

* ``HOROVOD_TIMELINE=/path/file.json``: ``hvd.init()`` starts recording (``on_init``); only rank 0
  writes, and its file describes every rank (one ``X`` tick per rank under ``NEGOTIATE_<OP>``).
* ``HOROVOD_TIMELINE_MARK_CYCLES=1``: ``CYCLE_START`` instants.
* ``HOROVOD_TIMELINE=DYNAMIC``: nothing is recorded until ``hvd.start_timeline(path, mark_cycles)``;
  ``hvd.stop_timeline()`` ends it; start/stop may be repeated.
* ``hvd.start_timeline`` without ``HOROVOD_TIMELINE`` set raises
  ``ValueError('Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.')``; before ``init``
  both raise Horovod's not-initialised ``ValueError`` (checked by ``lifecycle``).  Stopping a
  timeline that is not recording only logs "Timeline is already stopped..." (INFO), as Horovod does.
* ``hvd.shutdown()`` ends a ``start_timeline`` recording (``on_shutdown``).  An env-started one is
  flushed and paused instead, and continues in the same file after the next ``hvd.init()``
  (Horovod would truncate it: its test suite re-inits for every test).

Beyond Horovod:

* ``{rank}`` in the path: EVERY rank writes its own file (``tl.{rank}.json``); merge them with
  ``python -m horovod_compat.timeline merge``.
* ``HOROVOD_TIMELINE_MAX_BYTES=64M``: stop opening new spans once the file is that large.
* ``HOROVOD_TIMELINE_STEPS=start:stop``: record only cycles (bursts of collectives; one per training
  step with ``DistributedOptimizer``) ``start <= n < stop``.
* ``HOROVOD_TIMELINE_FLUSH_MS`` (default 100): how often the writer thread flushes to disk.

Cost when not recording: nothing (no listener is subscribed, collectives test ``hooks.active``).
"""
from __future__ import annotations

import atexit
import enum
import logging
import os
import time
import warnings
from typing import Optional, Tuple

from horovod_compat.timeline.writer import TimelineRecorder

from . import hooks

__all__ = ["Session", "State", "resolve_path", "DYNAMIC_REQUIRED", "ALREADY_STOPPED"]

DYNAMIC_REQUIRED = "Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage."
ALREADY_STOPPED = " Timeline is already stopped. Please start timeline before stopping it."

_log = logging.getLogger("horovod_compat.timeline")


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _parse_bytes(text: str) -> int:
    """``"64M"`` -> 67108864; plain integers are bytes; empty or invalid -> 0 (no bound)."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    if not text:
        return 0
    mult = 1
    if text[-1] in "KMG":
        mult = 1024 ** ("KMG".index(text[-1]) + 1)
        text = text[:-1]
    try:
        return int(float(text) * mult)
    except ValueError:
        _log.warning("ignoring invalid HOROVOD_TIMELINE_MAX_BYTES=%r", text)
        return 0


def _parse_steps(text: str) -> Optional[Tuple[int, Optional[int]]]:
    """``"10:20"`` -> (10, 20); ``"10:"`` -> (10, None); ``":5"`` -> (0, 5); empty -> None."""
    text = text.strip()
    if not text:
        return None
    try:
        a, _, b = text.partition(":")
        return (int(a) if a.strip() else 0, int(b) if b.strip() else None)
    except ValueError:
        _log.warning("ignoring invalid HOROVOD_TIMELINE_STEPS=%r (expected start:stop)", text)
        return None


def resolve_path(file_path: str, rank: int) -> Optional[str]:
    """The file this rank writes: ``{rank}`` substituted, or ``file_path`` on rank 0, else None."""
    if "{rank}" in file_path:
        return file_path.replace("{rank}", str(rank))
    return file_path if rank == 0 else None


class State(enum.Enum):
    OFF = "off"              # nothing records
    RECORDING = "recording"  # between a start and a stop, on every rank (writers hold a recorder)
    PAUSED = "paused"        # an env-started recording between hvd.shutdown() and the next init


class Session:
    """One process's timeline recording (see the module docstring).  Not thread-safe by itself:
    ``lifecycle`` calls it under its init/shutdown lock, the hvd API with the runtime active."""

    def __init__(self) -> None:
        self.state = State.OFF
        self.recorder: Optional[TimelineRecorder] = None
        self.requested_path: Optional[str] = None  # the path given (before {rank} substitution)
        self.from_env = False                      # started by HOROVOD_TIMELINE=<file>
        self.anchor: Optional[Tuple[int, int]] = None  # (perf_counter_ns, time_ns) at the first init
        self._exit_hook = False

    # -- the runtime's life cycle ---------------------------------------------------------------
    def on_init(self, rank: int, size: int) -> None:
        """``hvd.init()``: remember the time origin and honour ``HOROVOD_TIMELINE``.

        After ``shutdown -> init`` (Horovod's test suite, elastic resets) a PAUSED env recording goes
        on in the same file on the same time axis instead of being truncated."""
        env = os.environ.get("HOROVOD_TIMELINE", "")
        if self.state is State.PAUSED:
            if env == self.requested_path and (self.recorder is None or not self.recorder.closed):
                self.state = State.RECORDING
                if self.recorder is not None:
                    hooks.subscribe(self.recorder.listener)
                return
            self._stop()
        if self.state is State.OFF:
            self.anchor = (time.perf_counter_ns(), time.time_ns())
        if env and env != "DYNAMIC":
            try:
                self._start(env, _env_bool("HOROVOD_TIMELINE_MARK_CYCLES"), rank, size)
            except OSError as exc:   # like Horovod: a timeline that cannot be opened is not fatal
                self._stop()
                warnings.warn(f"Error opening the Horovod Timeline file {env!r}, will not write a "
                              f"timeline: {exc}", RuntimeWarning)
                return
            self.from_env = True

    def on_shutdown(self) -> None:
        """``hvd.shutdown()``: a ``start_timeline`` recording ends (Horovod's shutdown closes its
        timeline); an env-started one is flushed (open spans closed) and PAUSED: the next init
        continues it, the end of the process closes it."""
        if self.state is not State.RECORDING:
            return
        if not self.from_env:
            self._stop()
            return
        if self.recorder is not None:
            hooks.unsubscribe(self.recorder.listener)
            self.recorder.flush(close_open=True)
        self.state = State.PAUSED

    # -- the hvd API ----------------------------------------------------------------------------
    def start(self, file_path: str, mark_cycles: bool, rank: int, size: int) -> None:
        """``hvd.start_timeline``: record into ``file_path`` (only with ``HOROVOD_TIMELINE`` set).

        Starting again with the same path only updates ``mark_cycles``; another path closes the
        current file and opens the new one."""
        if not os.environ.get("HOROVOD_TIMELINE", ""):
            raise ValueError(DYNAMIC_REQUIRED)
        self._start(str(file_path), bool(mark_cycles), rank, size)
        self.from_env = False

    def stop(self) -> None:
        """``hvd.stop_timeline``: close the file; when nothing records, log as Horovod does."""
        if self.state is not State.RECORDING:
            _log.info(ALREADY_STOPPED)
            return
        self._stop()

    def is_recording(self) -> bool:
        """True between a start and a stop (on every rank, also those that write no file)."""
        return self.state is State.RECORDING

    def current_path(self) -> Optional[str]:
        """The file this rank is writing, or None."""
        rec = self.recorder
        return rec.path if rec is not None and not rec.closed else None

    # -- internals ------------------------------------------------------------------------------
    def _start(self, file_path: str, mark_cycles: bool, rank: int, size: int) -> None:
        if self.state is State.RECORDING and self.requested_path == file_path:
            if self.recorder is not None:
                self.recorder.set_mark_cycles(mark_cycles)
            return
        if self.state is not State.OFF:
            self._stop()
        path = resolve_path(file_path, rank)
        self.requested_path = file_path
        self.state = State.RECORDING
        if path is None:
            return   # not the coordinator: Horovod's other ranks write nothing
        anchor = self.anchor or (time.perf_counter_ns(), time.time_ns())
        rec = TimelineRecorder(
            path, rank=rank, size=size, mark_cycles=mark_cycles, anchor=anchor,
            flush_ms=float(os.environ.get("HOROVOD_TIMELINE_FLUSH_MS", "100") or 100),
            max_bytes=_parse_bytes(os.environ.get("HOROVOD_TIMELINE_MAX_BYTES", "")),
            cycles=_parse_steps(os.environ.get("HOROVOD_TIMELINE_STEPS", "")))
        self.recorder = rec
        hooks.subscribe(rec.listener)
        if not self._exit_hook:
            atexit.register(self.close)  # a PAUSED or forgotten recording is closed at exit
            self._exit_hook = True

    def _stop(self) -> None:
        rec, self.recorder = self.recorder, None
        self.state = State.OFF
        self.requested_path = None
        self.from_env = False
        if rec is not None:
            hooks.unsubscribe(rec.listener)
            rec.close()

    def close(self) -> None:
        """End whatever records (process exit)."""
        if self.state is not State.OFF:
            self._stop()
