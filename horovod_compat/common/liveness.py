"""Liveness beats: a rank that waits for a peer can tell a slow peer from a frozen one.

Each rank's runtime keeps one daemon thread (``_Beater``, started with the first process set that
has a channel for beats) that advances this process's *beat* every ``INTERVAL`` seconds on every
such channel, and drains the beats its peers send:

* ranks of a set that share this host: one 64-byte line per rank in a small shared segment
  (``ShmBeats``), mapped when the set is registered; a beat is a store to this rank's line;
* ranks of a set that negotiate over the TCP mesh (other hosts, or shared memory turned off):
  one more authenticated connection per pair of ranks, beats only (``_mesh.Mesh.beat``); a beat
  is one byte to every peer.

Neither goes through the job's c10d store or any other service a single rank hosts, so no rank's
view of its peers depends on rank 0 (or any one rank) being scheduled.

The beat comes from the rank's own process, not from its supervisor: a rank whose process is
stopped (SIGSTOP, a debugger), swapped out, or hung in native code that holds Python's GIL stops
beating, while a rank that computes, sleeps or waits in a collective of its own keeps beating.

A rank waiting in a collective checks the peers it waits for (``Watch.check``, called from the
wait loops of the shared-memory exchange and allreduce, the TCP mesh and the gloo transfers): a
peer whose beat has not advanced for ``HOROVOD_COMPAT_FROZEN_SECONDS`` (default 30; ``0`` turns
the check off) while this rank waited raises ``peer_failure(..., peer=<its global rank>,
frozen=True)``.  A peer on this host whose process is in state ``T``/``t`` (stopped) is reported
after ``STOPPED_SECONDS`` already.  A rank that was itself not scheduled (its own beat thread did
not run, or it did not look for a while) starts its clocks over rather than blame a peer.
"""
from __future__ import annotations

import json
import mmap
import os
import threading
import time
from typing import Any, Callable, Iterable, List, Mapping, Optional

from distributor import procfs

from .exceptions import HorovodInternalError, peer_failure

__all__ = ["INTERVAL", "STOPPED_SECONDS", "DEFAULT_FROZEN_SECONDS", "frozen_seconds", "ShmBeats",
           "Watch", "register", "unregister", "same_kind"]

#: Seconds between two beats of a process.
INTERVAL = 0.5
#: ``HOROVOD_COMPAT_FROZEN_SECONDS`` when unset: how long a peer may show no sign of life while
#: this rank waits for it before the collective fails.
DEFAULT_FROZEN_SECONDS = 30.0
#: The smallest bound accepted (a few beats: below it a busy machine would flag live ranks).
MIN_FROZEN_SECONDS = 2.0
#: The shortest silence of a rank towards the driver that ends a job (`driver_heartbeat_timeout`):
#: its heartbeat thread needs the GIL, which a rank's start holds for seconds at a time on a
#: loaded machine (loading torch's libraries, unpickling its function); 5 s has been seen.
MIN_DRIVER_SILENCE_SECONDS = 10.0
#: A peer on this host whose process is stopped (state T or t) is reported after this long.
STOPPED_SECONDS = 2.0
#: A waiting rank whose own checks or beat thread paused this long was not scheduled itself (or
#: was not waiting): it restarts its clocks instead of blaming its peers.
_RESET_GAP = 2.0
_LINE_WORDS = 8  # one beat counter per 64-byte line
#: Bytes of one rank's post (the stall inspector's op names), header included.
POST_BYTES = 8192


def frozen_seconds(env: Optional[Mapping[str, str]] = None) -> float:
    """``HOROVOD_COMPAT_FROZEN_SECONDS`` of `env` (default: this process's environment; unset:
    30): 0 turns frozen-peer detection off; other values are raised to at least
    ``MIN_FROZEN_SECONDS``."""
    raw = (os.environ if env is None else env).get("HOROVOD_COMPAT_FROZEN_SECONDS", "").strip()
    try:
        value = float(raw) if raw else DEFAULT_FROZEN_SECONDS
    except ValueError:
        raise ValueError(f"HOROVOD_COMPAT_FROZEN_SECONDS={raw!r} is not a number of seconds "
                         "(0 turns frozen-rank detection off)") from None
    return 0.0 if value <= 0 else max(value, MIN_FROZEN_SECONDS)


def driver_heartbeat_timeout(job_env: Mapping[str, str]) -> float:
    """The ``heartbeat_timeout`` of a Horovod launch (`distributor.LaunchRequest`), for ranks
    started with this process's environment plus `job_env`: ``HOROVOD_COMPAT_FROZEN_SECONDS`` (at
    least ``MIN_DRIVER_SILENCE_SECONDS``). A rank that the driver has not heard from for that long
    ends the job as one that stopped responding, as its peers end it when they wait for it in a
    collective; it also ends it where no peer waits for it (stopped inside ``hvd.init()``, which
    the peers' beats do not cover yet, or after the last step). The engine's default when the
    detection is off (0)."""
    from distributor.spec import DEFAULT_HEARTBEAT_TIMEOUT

    seconds = frozen_seconds({**os.environ, **job_env})
    return max(seconds, MIN_DRIVER_SILENCE_SECONDS) if seconds else DEFAULT_HEARTBEAT_TIMEOUT


# -- the beat thread ---------------------------------------------------------------------------
_lock = threading.Lock()
_sources: List[Any] = []
_beater: Optional["_Beater"] = None


class _Beater(threading.Thread):
    """Beats every registered source every ``INTERVAL`` seconds (daemon, one per process)."""

    def __init__(self) -> None:
        super().__init__(name="horovod_compat-liveness", daemon=True)
        self.tick = time.monotonic()
        self.pid = os.getpid()

    def run(self) -> None:
        while True:
            with _lock:
                for source in list(_sources):
                    try:
                        source.beat()
                    except Exception:  # a closed channel: its owner unregisters it
                        pass
            self.tick = time.monotonic()
            time.sleep(INTERVAL)


def register(source: Any) -> None:
    """Beat ``source`` (an object with ``beat()``) from now on; starts the beat thread."""
    global _beater
    with _lock:
        if source not in _sources:
            _sources.append(source)
        if _beater is None or _beater.pid != os.getpid() or not _beater.is_alive():
            _beater = _Beater()  # (again in a forked child: threads do not survive fork)
            _beater.start()


def unregister(source: Any) -> None:
    """Stop beating ``source``; once this returns the beat thread no longer touches it."""
    with _lock:
        if source in _sources:
            _sources.remove(source)


def _beating(now: float) -> bool:
    """Whether this process's beat thread ran recently (else its view of its peers is stale)."""
    b = _beater
    return b is not None and now - b.tick < _RESET_GAP


# -- the channels ------------------------------------------------------------------------------
class ShmBeats:
    """Beat lines in a shared segment, one per rank of a set on this host, then one *post* area
    per rank (the stall inspector's list of the ops it waits for, ``Watch.post``)."""

    def __init__(self, mm: mmap.mmap, n: int, me: int) -> None:
        self.mm, self.n, self.me = mm, n, me
        self.words = memoryview(mm).cast("q")
        self.bytes = memoryview(mm)
        register(self)

    @staticmethod
    def size(n: int) -> int:
        return (n * (_LINE_WORDS * 8 + POST_BYTES) + 4095) // 4096 * 4096

    def beat(self) -> None:
        i = self.me * _LINE_WORDS
        self.words[i] = self.words[i] + 1  # only this rank writes its line

    def count(self, j: int) -> int:
        return self.words[j * _LINE_WORDS]

    def _area(self, j: int) -> int:
        return self.n * _LINE_WORDS * 8 + j * POST_BYTES  # bytes: version, length, payload

    def post(self, payload: bytes) -> None:
        """Publish this rank's post (a sequence lock: the version is odd while it changes)."""
        base = self._area(self.me)
        w = base // 8
        version = self.words[w]
        self.words[w] = version + 1
        self.bytes[base + 16:base + 16 + len(payload)] = payload
        self.words[w + 1] = len(payload)
        self.words[w] = version + 2

    def posted(self, j: int) -> Optional[tuple]:
        """``(None, payload)`` of rank ``j``'s latest post, or None (none, or being written)."""
        base = self._area(j)
        w = base // 8
        for _attempt in range(3):
            version = self.words[w]
            if version == 0:
                return None
            size = min(self.words[w + 1], POST_BYTES - 16)
            payload = bytes(self.bytes[base + 16:base + 16 + size])
            if not version & 1 and self.words[w] == version:
                return None, payload
        return None

    def close(self) -> None:
        unregister(self)
        unmap(self.mm, self.words, self.bytes)


def unmap(mm: mmap.mmap, *views: memoryview) -> None:
    """Release ``views`` of a shared segment (``_shm.map_segment``), then the mapping; while a tensor
    still references it, leave it to the process's end."""
    try:
        for view in views:
            view.release()
        mm.close()
    except (BufferError, ValueError):
        pass


def same_kind(exc: Optional[BaseException], message: str) -> HorovodInternalError:
    """A new ``HorovodInternalError`` with ``message`` that keeps what ``exc`` said about a failed
    peer (``knock_on``, ``peer``, ``frozen``): for the later ops of a transport ``exc`` broke."""
    if exc is not None and getattr(exc, "knock_on", False):
        return peer_failure(message, peer=getattr(exc, "peer", None),
                            frozen=bool(getattr(exc, "frozen", False)))
    return HorovodInternalError(message)


# -- the waiting side --------------------------------------------------------------------------
class Watch:
    """One process set's view of its peers' beats, checked by the threads that wait for them.

    ``ranks``: the set's global ranks; ``beats``: an object with ``count(j)`` (set index ``j``), or
    None when the set has no beat channel; ``pids``: the peers' process ids when they share this
    host; ``context()``: what this rank waits in (op names) for the messages."""

    def __init__(self, ranks: List[int], me: int, beats: Any, pids: Optional[List[int]],
                 context: Optional[Callable[[], str]] = None) -> None:
        self.ranks, self.me, self.n = list(ranks), me, len(ranks)
        self.beats, self.pids, self.context = beats, pids, context
        self.after = frozen_seconds()
        self.seen: List[Any] = [None] * self.n
        self.since = [0.0] * self.n
        self.stopped: List[Optional[float]] = [None] * self.n
        self.last = 0.0
        self.lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.after > 0 and (self.beats is not None or self.pids is not None)

    def _count(self, j: int) -> Any:
        return self.beats.count(j) if self.beats is not None else None

    def check(self, peers: Iterable[int], what: str) -> None:
        """Raise ``peer_failure(..., frozen=True)`` for the first of ``peers`` (set indices this
        rank is waiting for) that showed no sign of life for too long; call it every fraction of
        a second while waiting."""
        if not self.enabled:
            return
        now = time.monotonic()
        with self.lock:
            if now - self.last > _RESET_GAP or (self.beats is not None and not _beating(now)):
                # this rank was not watching (between two waits) or not scheduled: start over
                for j in range(self.n):
                    self.seen[j] = self._count(j)
                    self.since[j] = now
                    self.stopped[j] = None
            self.last = now
            for j in peers:
                if j == self.me:
                    continue
                c = self._count(j)
                if c != self.seen[j]:
                    self.seen[j], self.since[j], self.stopped[j] = c, now, None
                    continue
                quiet = now - self.since[j]
                if self.pids is not None and (quiet >= 1.0 or self.beats is None):
                    if procfs.stopped(self.pids[j]):
                        first = self.stopped[j] = self.stopped[j] or now
                        if now - first >= min(STOPPED_SECONDS, self.after):
                            raise self._stopped(j, now - self.since[j], what)
                    else:
                        self.stopped[j] = None
                if self.beats is not None and quiet >= self.after:
                    raise self._frozen(j, quiet, what)

    def _where(self, what: str) -> str:
        ops = ""
        if self.context is not None:
            try:
                ops = self.context()
            except Exception:
                ops = ""
        return f"in {ops}" if ops else f"for {what}"

    def _frozen(self, j: int, quiet: float, what: str) -> HorovodInternalError:
        return peer_failure(
            f"rank {self.ranks[j]} stopped making progress (no sign of life for {quiet:.0f} s while "
            f"rank {self.ranks[self.me]} waited for it {self._where(what)}; its process may be "
            "stopped (SIGSTOP), swapped out or hung in native code, or its host unreachable; "
            f"HOROVOD_COMPAT_FROZEN_SECONDS={self.after:g})", peer=self.ranks[j], frozen=True)

    def _stopped(self, j: int, quiet: float, what: str) -> HorovodInternalError:
        return peer_failure(
            f"rank {self.ranks[j]} is stopped (SIGSTOP or a debugger): its process (pid "
            f"{self.pids[j]}) made no progress for {quiet:.0f} s while rank "
            f"{self.ranks[self.me]} waited for it {self._where(what)} (HOROVOD_COMPAT_FROZEN_SECONDS"
            "=0 turns this check off)", peer=self.ranks[j], frozen=True)

    # -- the stall inspector's posts ------------------------------------------------------------
    @property
    def posts(self) -> bool:
        """Whether the peers can read this rank's posts (``post``) on the set's beat channel."""
        return self.beats is not None and hasattr(self.beats, "post")

    def post(self, names: List[str]) -> None:
        """Tell the peers which ops this rank has submitted and waits for (the stall inspector's
        list: Horovod's "missing ranks" are the ranks whose list lacks an op)."""
        if not self.posts:
            return
        names = list(names)
        while True:
            payload = json.dumps([time.time(), names]).encode()
            if len(payload) <= POST_BYTES - 16 or not names:
                break
            names = names[:len(names) // 2]
        self.beats.post(payload)

    def posted(self, j: int) -> Optional[tuple]:
        """``(age in seconds, names)`` of peer ``j``'s latest post, or None."""
        if not self.posts:
            return None
        got = self.beats.posted(j)
        if got is None:
            return None
        received, payload = got
        try:
            sent, names = json.loads(payload.decode())
        except (ValueError, UnicodeDecodeError):
            return None
        age = time.monotonic() - received if received is not None else time.time() - sent
        return age, names

    def close(self) -> None:
        if isinstance(self.beats, ShmBeats):
            self.beats.close()
