"""``hvd.start_timeline`` / ``hvd.stop_timeline`` / ``HOROVOD_TIMELINE``: the adapter between the hvd
shim and the timeline recorder (``horovod_compat.timeline.writer``).

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
import logging
import os
import threading
import time
import warnings
from typing import Optional, Tuple

from horovod_compat.timeline.writer import TimelineRecorder

import torch.distributed as dist

from . import hooks, runtime

__all__ = ["start", "stop", "on_init", "on_shutdown", "is_recording", "current_path",
           "DYNAMIC_REQUIRED"]

DYNAMIC_REQUIRED = "Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage."
ALREADY_STOPPED = " Timeline is already stopped. Please start timeline before stopping it."

_log = logging.getLogger("horovod_compat.timeline")
_lock = threading.RLock()
_recorder: Optional[TimelineRecorder] = None
_requested_path: Optional[str] = None      # the path given (before {rank} substitution)
_recording = False                          # True on every rank between start and stop
_from_env = False                           # the recording was started by HOROVOD_TIMELINE=<file>
_paused = False                             # env recording between hvd.shutdown() and hvd.init()
_anchor: Optional[Tuple[int, int]] = None   # (perf_counter_ns, time_ns) at hvd.init
_atexit_registered = False


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


def _topology() -> Tuple[int, int]:
    """(global rank, size) of this process, from the shim's state (environment as a fallback)."""
    rt = runtime.active()
    if rt is not None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else rt.topology.rank
        return int(rank), int(rt.topology.size)
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def resolve_path(file_path: str, rank: int) -> Optional[str]:
    """The file this rank writes: ``{rank}`` substituted, or ``file_path`` on rank 0, else None."""
    if "{rank}" in file_path:
        return file_path.replace("{rank}", str(rank))
    return file_path if rank == 0 else None


def on_init() -> None:
    """Called by ``hvd.init()``: remember the time origin and honour ``HOROVOD_TIMELINE``.

    After ``shutdown -> init`` (Horovod's test suite, elastic resets) an env-started timeline goes on
    in the same file on the same time axis instead of being truncated.
    """
    global _anchor, _paused, _from_env
    with _lock:
        env = os.environ.get("HOROVOD_TIMELINE", "")
        if _paused:
            _paused = False
            if _recording and env == _requested_path and _recorder is not None and not _recorder.closed:
                hooks.subscribe(_recorder.listener)
                return
            _stop()
        if not _recording:
            _anchor = (time.perf_counter_ns(), time.time_ns())
        if env and env != "DYNAMIC":
            try:
                _start(env, _env_bool("HOROVOD_TIMELINE_MARK_CYCLES"))
            except OSError as exc:   # like Horovod: a timeline that cannot be opened is not fatal
                _stop()
                warnings.warn(f"Error opening the Horovod Timeline file {env!r}, will not write a "
                              f"timeline: {exc}", RuntimeWarning)
                return
            _from_env = True


def on_shutdown() -> None:
    """Called by ``hvd.shutdown()``.

    A ``start_timeline`` recording ends here (Horovod's shutdown closes its timeline).  An env-started
    one is flushed (spans still open are closed) and paused: the next ``hvd.init()`` continues it,
    the end of the process closes it.
    """
    global _paused
    with _lock:
        if not _recording:
            return
        if _from_env and _recorder is not None:
            hooks.unsubscribe(_recorder.listener)
            _recorder.flush(close_open=True)
            _paused = True
        elif _from_env:
            _paused = True        # a rank that writes nothing: just remember
        else:
            _stop()


def start(file_path: str, mark_cycles: bool = False) -> None:
    """``hvd.start_timeline``: record into ``file_path`` (only with ``HOROVOD_TIMELINE`` set).

    Starting again with the same path only updates ``mark_cycles``; another path closes the current
    file and opens the new one.
    """
    global _from_env
    if not os.environ.get("HOROVOD_TIMELINE", ""):
        raise ValueError(DYNAMIC_REQUIRED)
    with _lock:
        _start(str(file_path), bool(mark_cycles))
        _from_env = False


def stop() -> None:
    """``hvd.stop_timeline``: close the file; when nothing records, log as Horovod does."""
    with _lock:
        if not _recording:
            _log.info(ALREADY_STOPPED)
            return
        _stop()


def is_recording() -> bool:
    """True between a start and a stop (on every rank, also those that write no file)."""
    return _recording


def current_path() -> Optional[str]:
    """The file this rank is writing, or None."""
    rec = _recorder
    return rec.path if rec is not None and not rec.closed else None


def _start(file_path: str, mark_cycles: bool) -> None:
    global _recorder, _requested_path, _recording, _atexit_registered
    if _recording and _requested_path == file_path:
        if _recorder is not None:
            _recorder.set_mark_cycles(mark_cycles)
        return
    if _recording:
        _stop()
    rank, size = _topology()
    path = resolve_path(file_path, rank)
    _requested_path = file_path
    _recording = True
    if path is None:
        return   # not the coordinator: Horovod's other ranks write nothing
    anchor = _anchor or (time.perf_counter_ns(), time.time_ns())
    rec = TimelineRecorder(
        path, rank=rank, size=size, mark_cycles=mark_cycles, anchor=anchor,
        flush_ms=float(os.environ.get("HOROVOD_TIMELINE_FLUSH_MS", "100") or 100),
        max_bytes=_parse_bytes(os.environ.get("HOROVOD_TIMELINE_MAX_BYTES", "")),
        cycles=_parse_steps(os.environ.get("HOROVOD_TIMELINE_STEPS", "")))
    _recorder = rec
    hooks.subscribe(rec.listener)
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True


def _stop() -> None:
    global _recorder, _recording, _requested_path, _from_env, _paused
    rec = _recorder
    _recorder = None
    _recording = False
    _requested_path = None
    _from_env = _paused = False
    if rec is not None:
        hooks.unsubscribe(rec.listener)
        rec.close()


def _at_exit() -> None:
    with _lock:
        if _recording:
            _stop()
