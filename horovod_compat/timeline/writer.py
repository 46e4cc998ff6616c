"""Recording a Horovod timeline: a crash-safe Chrome-trace file and the recorder that fills it.

Two layers, both independent of torch:

``TraceFile``
    A JSON array on disk that is *valid JSON after every write*: the file always ends with ``\\n]``;
    each append overwrites those two bytes (``os.pwrite`` at a remembered offset) with
    ``,\\n{event}...\\n]`` in ONE system call.  A rank that is SIGKILLed between two flushes leaves a
    complete file; what was still in memory is lost, never the file's validity.  This is the fix for
    Horovod's ``[``-only files after a crash.

``TimelineRecorder``
    The hot path is one ``deque.append`` of ``(perf_counter_ns, event, name, info)`` per collective
    event (a few hundred ns).  A daemon thread wakes every ``flush_ms`` (default 100 ms), turns the
    queued events into Horovod's trace events (one pid per tensor name with ``process_name``
    metadata, ``NEGOTIATE_<OP>`` span with one ``X`` tick per rank, the ``<OP>`` span with the backend
    activity (``GLOO_ALLREDUCE`` ...) inside it, fusion-buffer copies, dtype and shape on the closing
    ``E``) and appends them to the file with one write.  Formatting off the training thread is what
    keeps the timeline cheap.  A negotiation is written when it ends, so that its span can open at
    the first rank's readiness (when negotiation reports every rank's ready time: ``ALL_READY``
    with ``ready_us``/``ranks``) and an op launched speculatively before the end of negotiation is
    still nested after it, as in Horovod's files.

Bounds for long runs: ``max_bytes`` stops opening new spans once the file is that large (open spans
are still closed, so the file stays balanced) and ``cycles=(start, stop)`` records only the bursts
of collective activity numbered ``start <= n < stop`` (a *cycle* here is a burst: it begins when a
collective is submitted while none is in flight; with ``DistributedOptimizer`` that is one training
step).  Both write a ``timeline_truncated`` metadata event when they drop something.

Two additions to Horovod's format, both valid Chrome-trace events that chrome://tracing shows and
Horovod's readers ignore:

* **internal ops**: collectives horovod-compat issues for its own bookkeeping (the
  ``DistributedOptimizer``'s one-off agreement check and bucket-order exchange, the layout checks and
  fused buffers of ``broadcast_parameters`` / ``broadcast_optimizer_state``) are declared with
  ``mark_internal(name)`` by the code that issues them.  Their row (pid) gets a ``process_labels``
  metadata event with the label ``INTERNAL_LABEL`` (``"horovod-compat internal"``) and sorts after
  every tensor row; the reader recognises them by that label (``Timeline.internal``) and the plot
  and summary hide them unless asked (``--internal``).
* **training steps**: the hook event ``STEP`` (``DistributedOptimizer.synchronize()`` emits it
  when every gradient of the step has been reduced, i.e. just before the wrapped optimizer's
  update) becomes a global instant event ``{"ph": "i", "name": "STEP", "s": "g",
  "args": {"step": n, "optimizer": id}}`` -- a vertical line in chrome://tracing and the step
  boundaries of ``python -m horovod_compat.timeline plot``.  Written whether or not cycles are
  marked (``HOROVOD_TIMELINE_MARK_CYCLES``), within the same bounds as the spans.
"""
from __future__ import annotations

import collections
import json
import os
import socket
import threading
import time
import warnings
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

__all__ = ["TraceFile", "TimelineRecorder", "op_label", "backend_activity", "format_shape",
           "format_dtype", "NEGOTIATE_START", "ALL_READY", "OP_START", "OP_END", "ACTIVITY_START",
           "ACTIVITY_END", "STEP", "STEP_MARK", "INTERNAL_LABEL", "mark_internal", "is_internal"]

# the event names of the hooks this recorder listens to (``hooks`` imports no torch); ``STEP``: the
# end of a training step (``info``: ``step``, ``optimizer``), from ``DistributedOptimizer.synchronize()``
from horovod_compat.common.hooks import (  # noqa: E402
    ACTIVITY_END, ACTIVITY_START, ALL_READY, NEGOTIATE_START, OP_END, OP_START, STEP)
#: name of the instant event a ``STEP`` becomes in the trace
STEP_MARK = "STEP"
#: ``process_labels`` label of an internal op's row (see the module docstring)
INTERNAL_LABEL = "horovod-compat internal"
# sort_index offset of internal rows: after every tensor row in chrome://tracing
_INTERNAL_SORT = 1_000_000

_internal_names: set = set()


def mark_internal(name: str) -> str:
    """Declare the collective named ``name`` (the name given to the op, as the hooks see it) one of
    horovod-compat's own bookkeeping ops: its timeline row is labelled ``INTERNAL_LABEL``.  Returns
    ``name``.  Process-wide; the op's code calls it before issuing the op."""
    _internal_names.add(name)
    return name


def is_internal(name: str) -> bool:
    """True for a name declared with ``mark_internal``."""
    return name in _internal_names

_TAIL = b"\n]"

# collective kind -> Horovod's op label (the suffix of NEGOTIATE_<OP> and the op span's name)
_OP_LABELS = {
    "allreduce": "ALLREDUCE", "grouped_allreduce": "ALLREDUCE", "sparse_allreduce": "ALLREDUCE",
    "adasum": "ALLREDUCE",
    "allgather": "ALLGATHER", "grouped_allgather": "ALLGATHER",
    "broadcast": "BROADCAST",
    "alltoall": "ALLTOALL",
    "reducescatter": "REDUCESCATTER", "grouped_reducescatter": "REDUCESCATTER",
    "barrier": "BARRIER", "join": "JOIN",
}
# op label -> backend activity suffix (Horovod writes GLOO_BCAST, not GLOO_BROADCAST)
_BACKEND_SUFFIX = {"BROADCAST": "BCAST"}
_KNOWN_PREFIXES = frozenset(_OP_LABELS)


def op_label(kind: str) -> str:
    """Horovod's name for a collective kind: ``grouped_allreduce`` -> ``ALLREDUCE``."""
    return _OP_LABELS.get(kind) or kind.upper()


def backend_activity(label: str, backend: str = "GLOO") -> Optional[str]:
    """The activity Horovod nests in an op span: ``GLOO_ALLREDUCE``, ``NCCL_ALLREDUCE``, ``GLOO_BCAST``.

    None for ops without a data transfer (barrier, join).
    """
    if label in ("BARRIER", "JOIN"):
        return None
    return f"{backend}_{_BACKEND_SUFFIX.get(label, label)}"


def format_dtype(dtype: Any) -> str:
    """``torch.float32`` / ``"torch.float32"`` -> ``"float32"`` (Horovod's spelling)."""
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def format_shape(shape: Any) -> str:
    """``(3, 2)`` -> ``"[3, 2]"``; a sequence of shapes -> ``"[[3, 2], [1, 2]]"``."""
    if shape is None:
        return "[]"
    if isinstance(shape, str):
        return shape
    items = list(shape)
    if items and isinstance(items[0], (tuple, list)):
        return "[" + ", ".join(format_shape(s) for s in items) + "]"
    return "[" + ", ".join(str(int(d)) for d in items) + "]"


class TraceFile:
    """A Chrome-trace JSON array that is valid after every ``append`` (see the module docstring)."""

    def __init__(self, path: str, first_events: Sequence[str]) -> None:
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        head = ("[\n" + ",\n".join(first_events)).encode()
        os.write(self._fd, head + _TAIL)
        self._end = len(head)          # offset of the closing "\n]"
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """Bytes in the file, the closing bracket included."""
        return self._end + len(_TAIL)

    def append(self, events: Sequence[str]) -> None:
        """Add already-serialised events; one ``pwrite`` that also rewrites the closing bracket."""
        if not events:
            return
        data = (",\n" + ",\n".join(events)).encode()
        with self._lock:
            if self._fd < 0:
                return
            os.pwrite(self._fd, data + _TAIL, self._end)
            self._end += len(data)

    def close(self) -> None:
        """Close the file descriptor (the content is already complete)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class _Track:
    """Per tensor name: its pid and which spans are open."""

    __slots__ = ("pid", "label", "kind", "busy", "neg_open", "neg_ts", "op_ts", "op_open", "backend",
                 "backend_open", "dtype", "shape", "activities", "recorded", "idle_ts", "fuse_in")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.label = ""
        self.kind = ""
        self.busy = False       # between submission (or launch) and the end of the op
        self.neg_open = False
        self.neg_ts = 0
        self.op_ts: Optional[int] = None   # launch time of the op (may precede negotiation's end)
        self.op_open = False             # the op's B has been written (or would have been)
        self.backend: Optional[str] = None
        self.backend_open = False
        self.dtype: Any = None
        self.shape: Any = None
        self.activities = 0
        self.recorded = False   # the current op's spans are being written (bounds may skip ops)
        self.idle_ts = 0        # when the previous op on this track ended (its closing E)
        self.fuse_in = False    # a fusion-buffer copy comes first: the backend span opens after it


class TimelineRecorder:
    """Collects collective events on the hot path and writes Horovod's timeline on a thread.

    ``listener`` is the callable to subscribe to ``horovod_compat.common.hooks``
    (``listener(event, tensor_name, info)``).  ``anchor`` is ``(perf_counter_ns, time_ns)`` taken at
    the same moment (``hvd.init``): timestamps are µs since then, and the wall-clock anchor is
    written into the metadata so per-rank files can be merged onto one time axis.
    """

    def __init__(self, path: str, *, rank: int = 0, size: int = 1, mark_cycles: bool = False,
                 anchor: Optional[Tuple[int, int]] = None, flush_ms: float = 100.0,
                 max_bytes: int = 0, cycles: Optional[Tuple[int, Optional[int]]] = None,
                 backend: str = "GLOO") -> None:
        if anchor is None:
            anchor = (time.perf_counter_ns(), time.time_ns())
        self.path = path
        self.rank = rank
        self.size = size
        self.mark_cycles = mark_cycles
        self.backend = backend
        self.max_bytes = int(max_bytes or 0)
        self.cycles = cycles
        self._anchor_perf = anchor[0]
        self._anchor_wall_us = anchor[1] // 1000
        self._flush_s = max(0.001, flush_ms / 1000.0)
        self._queue: Deque[tuple] = collections.deque()
        self._tracks: Dict[str, _Track] = {}
        self._inflight = 0
        self._next_pid = 0
        self._batch_bytes = 0
        self._cycle = -1
        self._truncated = False
        self._drain_lock = threading.Lock()
        meta = {"start_time_since_epoch_in_micros": self._anchor_wall_us,
                "horovod_compat": {"rank": rank, "size": size, "host": socket.gethostname(),
                                   "pid": os.getpid(), "clock": "perf_counter"}}
        self._file = TraceFile(path, [
            '{"name": "process_name", "ph": "M", "pid": 0, "args": ' + json.dumps(meta) + "}",
            '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}',
        ])
        queue_append = self._queue.append
        clock = time.perf_counter_ns

        def listener(event: str, name: str, info: Dict[str, Any]) -> None:
            queue_append((clock(), event, name, info))

        self.listener: Callable[[str, str, Dict[str, Any]], None] = listener
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="horovod_compat-timeline", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------ control
    def set_mark_cycles(self, on: bool) -> None:
        """Turn ``CYCLE_START`` instants on or off from the next cycle on."""
        self.mark_cycles = bool(on)

    def flush(self, close_open: bool = False) -> None:
        """Write everything queued so far (callable from any thread); ``close_open`` also ends the
        spans still open (marked ``incomplete``), e.g. at ``hvd.shutdown()``."""
        self._drain(final=close_open)

    def close(self) -> None:
        """Stop the thread, write what is queued, close spans still open (args ``incomplete``)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._drain(final=True)
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------------------ thread
    def _run(self) -> None:
        warned = False
        while not self._stop.wait(self._flush_s):
            try:
                self._drain()
            except Exception as exc:  # a broken timeline (disk full...) must never break training
                if not warned:
                    warned = True
                    warnings.warn(f"horovod_compat timeline {self.path!r}: writing failed, events are "
                                  f"lost: {exc!r}", RuntimeWarning)

    def _ts(self, t_ns: int) -> int:
        return (t_ns - self._anchor_perf) // 1000

    def _drain(self, final: bool = False) -> None:
        with self._drain_lock:
            out: List[str] = []
            q = self._queue
            self._batch_bytes = 0
            n = 0
            while q:
                t_ns, event, name, info = q.popleft()
                self._translate(out, self._ts(t_ns), event, name, info)
                if self.max_bytes:
                    m = len(out)
                    self._batch_bytes += sum(len(x) for x in out[n:m]) + 2 * (m - n)
                    n = m
            if final:
                ts = self._ts(time.perf_counter_ns())
                for tr in self._tracks.values():
                    if tr.busy:
                        self._close_all(out, tr, ts, incomplete=True)
            if out:
                self._file.append(out)

    # ------------------------------------------------------------------------------ translation
    def _over_budget(self) -> bool:
        if self.max_bytes and self._file.size + self._batch_bytes >= self.max_bytes:
            return True
        if self.cycles is not None:
            start, stop = self.cycles
            if self._cycle < start or (stop is not None and self._cycle >= stop):
                return True
        return False

    def _note_truncated(self, out: List[str], ts: int, why: str) -> None:
        if not self._truncated:
            self._truncated = True
            out.append('{"name": "timeline_truncated", "ph": "M", "pid": 0, "args": '
                       + json.dumps({"ts": ts, "reason": why}) + "}")

    def _get(self, name: str) -> _Track:
        tr = self._tracks.get(name)
        if tr is None:
            tr = self._tracks[name] = _Track(0)
        return tr

    def _ensure_pid(self, out: List[str], tr: _Track, name: str) -> None:
        """Give the tensor its pid (and write the ``process_name`` metadata) on first recording."""
        if tr.pid:
            return
        self._next_pid += 1
        tr.pid = self._next_pid
        label = display_name(name, tr.kind)
        out.append('{"name": "process_name", "ph": "M", "pid": %d, "args": {"name": %s}}'
                   % (tr.pid, json.dumps(label)))
        internal = name in _internal_names
        out.append('{"name": "process_sort_index", "ph": "M", "pid": %d, "args": {"sort_index": %d}}'
                   % (tr.pid, tr.pid + (_INTERNAL_SORT if internal else 0)))
        if internal:
            out.append('{"name": "process_labels", "ph": "M", "pid": %d, "args": {"labels": %s}}'
                       % (tr.pid, json.dumps(INTERNAL_LABEL)))

    def _begin_op(self, out: List[str], tr: _Track, name: str, ts: int) -> None:
        """``tr`` becomes busy: count cycles, mark them, decide (bounds) whether the op is recorded."""
        if self._inflight == 0:
            self._cycle += 1
            if self.mark_cycles and not self._over_budget():
                out.append('{"ph": "i", "name": "CYCLE_START", "ts": %d, "s": "g"}' % ts)
        self._inflight += 1
        tr.busy = True
        if self._over_budget():
            reason = ("max_bytes" if self.max_bytes and self._file.size + self._batch_bytes >= self.max_bytes
                      else "cycles")
            self._note_truncated(out, ts, reason)
            tr.recorded = False
        else:
            tr.recorded = True
            self._ensure_pid(out, tr, name)

    def _translate(self, out: List[str], ts: int, event: str, name: str, info: Dict[str, Any]) -> None:
        if event == STEP:
            if not self._over_budget():
                args = {k: info[k] for k in ("step", "optimizer") if k in info}
                out.append('{"ph": "i", "name": "%s", "ts": %d, "s": "g", "args": %s}'
                           % (STEP_MARK, ts, json.dumps(args)))
            return
        if event == NEGOTIATE_START:
            tr = self._get(name)
            if tr.busy:
                self._close_all(out, tr, ts, incomplete=True)   # a previous op never ended
            # an emitter that does not say (DistributedOptimizer's buckets) reduces gradients
            tr.kind = info.get("kind", "") or tr.kind or "allreduce"
            tr.label = op_label(tr.kind)
            self._begin_op(out, tr, name, ts)
            # written when negotiation ends: then the first ready rank's time is known
            tr.neg_open, tr.neg_ts, tr.op_ts = True, ts, None
        elif event == ALL_READY:
            tr = self._tracks.get(name)
            if tr is not None and tr.neg_open:
                self._end_negotiation(out, tr, ts, info)
        elif event == OP_START:
            tr = self._get(name)
            kind = info.get("kind") or ""
            if kind:
                tr.kind = kind
            tr.label = op_label(tr.kind) if tr.kind else "ALLREDUCE"
            if tr.op_open or tr.op_ts is not None:
                self._close_all(out, tr, ts, incomplete=True)
            if not tr.busy:
                self._begin_op(out, tr, name, ts)   # an op without negotiation
            tr.dtype, tr.shape = info.get("dtype"), info.get("shape")
            tr.fuse_in = bool(info.get("fused"))
            dev = str(info.get("device") or "")
            be = info.get("backend") or ("NCCL" if dev.startswith("cuda") else self.backend)
            tr.backend = backend_activity(tr.label, str(be).upper())
            tr.op_ts = ts
            if not tr.neg_open:
                self._open_op(out, tr, ts)
            # else: launched speculatively on a cache hit, before negotiation finished; the op is
            # written when negotiation ends (the transfer cannot progress before that)
        elif event == OP_END:
            tr = self._tracks.get(name)
            if tr is not None and tr.busy:
                self._close_all(out, tr, ts, error=info.get("error"))
        elif event == ACTIVITY_START:
            tr = self._tracks.get(name)
            if tr is None or not tr.busy or tr.op_ts is None:
                return
            if tr.neg_open:
                self._end_negotiation(out, tr, ts, {})
            if not tr.recorded:
                return
            act = str(info.get("activity", "ACTIVITY"))
            if tr.backend_open and tr.activities == 0 and act.startswith("MEMCPY_OUT"):
                # the transfer is over once the copies out start: close the backend span first
                out.append('{"ph": "E", "ts": %d, "pid": %d}' % (ts, tr.pid))
                tr.backend_open = False
            tr.activities += 1
            out.append('{"ph": "B", "name": %s, "ts": %d, "pid": %d}' % (json.dumps(act), ts, tr.pid))
        elif event == ACTIVITY_END:
            tr = self._tracks.get(name)
            if tr is None or not tr.recorded or tr.activities <= 0:
                return
            tr.activities -= 1
            out.append('{"ph": "E", "ts": %d, "pid": %d}' % (ts, tr.pid))
            if tr.fuse_in and tr.activities == 0:
                # the copy into the fusion buffer is done: the transfer follows, as in Horovod's
                # ALLREDUCE > MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER
                tr.fuse_in = False
                if tr.backend and tr.op_open:
                    self._open_backend(out, tr, ts)

    def _end_negotiation(self, out: List[str], tr: _Track, ts: int, info: Dict[str, Any],
                         extra: Optional[Dict[str, Any]] = None) -> None:
        """Write ``NEGOTIATE_<OP>`` B, one tick per rank, E -- and the op if it already started.

        With per-rank readiness (``info["ready_us"]``: wall-clock µs per rank of the set, ``ranks``:
        their global ranks), the span runs from the first to the last rank's readiness, as in
        Horovod.  Without it only this rank's tick is known and the span ends when this rank learned
        that every rank is ready (or when the op was launched, whichever came first).
        """
        tr.neg_open = False
        if not tr.recorded:
            return
        ticks = [(tr.neg_ts, self.rank)]
        ready = info.get("ready_us")
        if ready:
            ranks = info.get("ranks") or list(range(len(ready)))
            for r, t_us in zip(ranks, ready):
                if t_us is not None and int(r) != self.rank:
                    ticks.append((int(t_us) - self._anchor_wall_us, int(r)))
            ticks.sort()
            # a rank ready before this file's time origin (it finished init first) starts at 0; a
            # rank that submitted the next op under this name before this rank finished the
            # previous one is drawn at the previous op's end (spans of one tensor never overlap,
            # and per tensor the file stays in time order)
            start = max(0, tr.idle_ts, min(ticks[0][0], tr.neg_ts))
            if tr.op_ts is None:
                end = ts        # this rank learned that all are ready (descriptors checked)
            else:               # launched speculatively: the transfer waits for the last rank
                end = min(ts, max(ticks[-1][0], tr.op_ts))
        else:
            start = tr.neg_ts
            end = ts if tr.op_ts is None else min(ts, tr.op_ts)
        pid = tr.pid
        out.append('{"ph": "B", "name": "NEGOTIATE_%s", "ts": %d, "pid": %d}' % (tr.label, start, pid))
        for t, r in ticks:
            out.append('{"ph": "X", "name": "%d", "ts": %d, "pid": %d, "dur": 0}'
                       % (r, min(max(t, start), end), pid))
        if extra:
            out.append('{"ph": "E", "ts": %d, "pid": %d, "args": %s}' % (end, pid, json.dumps(extra)))
        else:
            out.append('{"ph": "E", "ts": %d, "pid": %d}' % (end, pid))
        if tr.op_ts is not None and not tr.op_open:
            self._open_op(out, tr, max(tr.op_ts, end))

    def _open_op(self, out: List[str], tr: _Track, ts: int) -> None:
        tr.op_open = True
        if not tr.recorded:
            return
        pid = tr.pid
        out.append('{"ph": "B", "name": "%s", "ts": %d, "pid": %d}' % (tr.label, ts, pid))
        if tr.backend and not tr.fuse_in:
            self._open_backend(out, tr, ts)

    def _open_backend(self, out: List[str], tr: _Track, ts: int) -> None:
        out.append('{"ph": "B", "name": "%s", "ts": %d, "pid": %d}' % (tr.backend, ts, tr.pid))
        tr.backend_open = True

    def _close_all(self, out: List[str], tr: _Track, ts: int, error: Any = None,
                   incomplete: bool = False) -> None:
        """``tr`` becomes idle: close every span open on it (innermost first); the op's ``E``
        carries dtype and shape, as Horovod's does."""
        if not tr.busy:
            return
        tr.busy = False
        if self._inflight > 0:
            self._inflight -= 1
        extra: Dict[str, Any] = {}
        if error:
            extra["error"] = str(error)
        if incomplete:
            extra["incomplete"] = True
        if tr.neg_open:
            # negotiation never finished (error, or still pending at stop) -- or the op ended
            # before the ALL_READY event arrived
            self._end_negotiation(out, tr, ts, {}, extra if tr.op_ts is None else None)
        if tr.recorded and tr.op_open:
            pid = tr.pid
            while tr.activities > 0:
                tr.activities -= 1
                out.append('{"ph": "E", "ts": %d, "pid": %d}' % (ts, pid))
            if tr.backend_open:
                out.append('{"ph": "E", "ts": %d, "pid": %d}' % (ts, pid))
            args: Dict[str, Any] = {}
            if tr.dtype:
                args["dtype"] = format_dtype(tr.dtype)
            if tr.shape is not None and tr.label not in ("BARRIER", "JOIN"):
                args["shape"] = format_shape(tr.shape)
            args.update(extra)
            if args:
                out.append('{"ph": "E", "ts": %d, "pid": %d, "args": %s}' % (ts, pid, json.dumps(args)))
            else:
                out.append('{"ph": "E", "ts": %d, "pid": %d}' % (ts, pid))
        tr.neg_open = tr.op_open = tr.backend_open = False
        tr.idle_ts = ts
        tr.op_ts = None
        tr.backend = None
        tr.activities = 0
        tr.dtype = tr.shape = None


def display_name(name: str, kind: str) -> str:
    """The process name Horovod shows for a tensor: ``allreduce.grad_a``.

    Names that already carry a collective prefix (``allreduce.x``, ``grouped_allreduce.g_1of2``) are
    kept; others get ``<kind>.``; an empty name becomes ``<kind>.noname``.
    """
    head = name.split(".", 1)[0]
    if head in _KNOWN_PREFIXES:
        return name
    kind = kind or "op"
    return f"{kind}.{name}" if name else f"{kind}.noname"
