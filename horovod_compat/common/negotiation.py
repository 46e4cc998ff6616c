"""The coordinator: Horovod's guarantees for every collective, on every transport.

Horovod's design, reproduced (our code): every op a rank submits enters a per-process-set queue; the
ranks *negotiate* in rounds which ops every rank has submitted, by name, and run those in one agreed
order.  What follows from it, on every launcher and transport:

* submission order may differ between ranks (an async op before a barrier on one rank and after it
  on another; a loop that submits names in a different order per rank): ops are paired by name;
  unnamed ops are paired by their position among the set's unnamed ops, as in ``torch.distributed``;
* ``join()``: a joined rank takes part in the rounds without ops; every op the other ranks agree on
  runs with the joined rank contributing zeros (allreduce kinds; others raise on the other ranks);
  ``join()`` returns the global rank of the last rank to join;
* a name already in flight on this rank raises ``ValueError`` at submission and touches nothing else;
* mismatched shapes / dtypes / ops / roots raise ``HorovodInternalError`` on every rank and nothing
  moves, so later collectives still work; the message (``mismatch``) names the op and which ranks
  sent what;
* a rank that dies or leaves breaks the exchange: every rank's pending and later ops raise
  ``HorovodInternalError`` (until ``shutdown()`` and ``init()``);
* a rank that stops making progress (its process stopped, hung in native code, its host gone)
  while others wait for it is named by them: their wait raises ``peer_failure(..., frozen=True)``
  after ``HOROVOD_COMPAT_FROZEN_SECONDS`` without a beat from it (``liveness``; a slow rank that
  is alive keeps beating and is only waited for);
* the stall inspector and the timeline see every op (``inflight``; ``hooks`` events).

A round (``SetState._round``): each rank sends one message (``_exchange``: shared memory on one host,
the set's TCP mesh across hosts, gloo for sets too large for a mesh) listing the ops it submitted since its last message, and its flags (joined).  An op
whose descriptor is in the *response cache* is sent as its cache id (3 words); others travel as full
descriptors (JSON, never pickle) and are added to the cache by every rank in the same order, so the
caches stay identical and the steady state costs one small message per op.  Every rank then computes
the same list of ready ops (announced by every rank that has not joined), validates each one, and
runs its data transfer (``Plan.launch`` / ``finish``, or the kind's dummy on a joined rank) in that
order, in the thread that drives the round.

Who drives: the thread that waits for an op (``Pending.wait``) runs rounds until its op is done; a
background thread per set runs them for async ops (``Pending.detach``: handles after one
``HOROVOD_CYCLE_TIME``, the optimizer's buckets at once), so they progress while the caller
computes, and for ops not claimed within ``_GRACE`` seconds.  A rank with nothing to
do takes part in no round; a peer that needs it waits in the exchange, which is what Horovod's stall
inspector reports.

Shutdown (``SetState.close``) runs in one order: announce leaving (peers waiting for this rank
raise), fail this rank's pending ops, stop the background thread, and release the shared memory only
if no thread can still touch it.
"""
from __future__ import annotations

import collections
import ctypes
import datetime
import itertools
import json
import os
import threading
import time
import traceback
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from distributor import procfs

from . import _exchange, _hierarchical, _mesh, _shm, hooks, liveness, mismatch
from .exceptions import HorovodInternalError, peer_failure

__all__ = ["Desc", "Agreement", "SetState", "Plan", "Pending", "register_kind", "submit", "join",
           "DUPLICATE_NAME_MESSAGE", "SHUT_DOWN_MESSAGE"]

DUPLICATE_NAME_MESSAGE = (
    "Requested to {kind} a tensor with the same name as another tensor that is currently being "
    "processed.  If you want to request another tensor, use a different tensor name. (name: {name})")
SHUT_DOWN_MESSAGE = ("Horovod has been shut down. This was caused by an exception on one of the "
                     "ranks or an attempt to {op} a tensor after one of the ranks finished execution. "
                     "If the shutdown was caused by an exception, you should see the exception in the "
                     "log before the first shutdown message.")

JOINED = 1
#: How long a synchronous op is left to the thread that submitted it before the background thread
#: drives it (that thread normally calls ``wait`` right away).
_GRACE = 0.002
#: Horovod's cycle time (``HOROVOD_CYCLE_TIME``, ms): how long the background thread lets async ops
#: accumulate before it starts negotiating them (ops submitted back to back go out in one message,
#: and a name submitted twice in a row is still in flight the second time, as in Horovod).
_CYCLE = float(os.environ.get("HOROVOD_CYCLE_TIME", "1")) / 1000.0
#: How long the name of an async op that finished while nobody looked (no ``poll``/``wait`` yet)
#: still counts as in use.  Horovod raises the duplicate-name error while the first op is being
#: processed; whether it still is when the caller's next line runs is a race that a busy machine
#: (a preempted thread) loses.  Within this window the name is busy, as if the op had taken that
#: much longer -- an outcome Horovod allows -- and after it (or once the handle was polled or
#: synchronized) the name is free.
_REUSE_GRACE = 0.05
#: Response cache capacity (Horovod's ``HOROVOD_CACHE_CAPACITY``, default 1024; 0 disables it).
_CACHE_CAPACITY = int(os.environ.get("HOROVOD_CACHE_CAPACITY", "1024"))
#: A gloo transfer is waited for in slices this long, its peers' liveness checked between them.
_SLICE = datetime.timedelta(seconds=0.25)
#: Seconds a transfer may still take after a peer of it left the job (``hvd.shutdown()``, an
#: elastic reset): what the peer sent before it left is in this host's socket buffers, read in
#: milliseconds, so a transfer still waiting after this long waits for data that never comes.
DEPARTED_GRACE_SECONDS = 3.0
_Work = getattr(dist, "Work", ())


class Desc(NamedTuple):
    """What one rank asks for; equal descriptors on every rank mean the op is well-formed."""

    kind: str
    name: str            # user-given name, "" for unnamed ops
    op: int              # Horovod reduce-op code, -1 when not a reduction
    dtype: str
    shapes: Tuple[Tuple[int, ...], ...]
    extra: tuple = ()
    device: str = "cpu"  # device type of the tensors ("cpu" travels on gloo, "cuda" on NCCL)


class Agreement(NamedTuple):
    """Every rank's descriptor of one op (None for ranks that joined)."""

    descs: Tuple[Optional[Desc], ...]

    def template(self, index: int) -> Desc:
        """The descriptor rank ``index`` should use for a dummy contribution."""
        d = self.descs[index]
        return d if d is not None else next(x for x in self.descs if x is not None)


class Plan:
    """One submitted collective.  Subclasses (in ``collectives``) define the data transfer.

    ``launch(agr)`` starts the transfer with this rank's real tensors and returns torch Work
    objects; ``finish(agr)`` builds the result after they completed.
    """

    __slots__ = ("desc", "name")

    def launch(self, agr: Agreement) -> List[Any]:
        raise NotImplementedError

    def finish(self, agr: Agreement) -> Any:
        raise NotImplementedError

    def transport(self) -> Optional[str]:
        """The timeline's name for what moves this op's data, when not the set's backend."""
        return None


# kind -> (validate(descs, set_state) -> mismatch.Mismatch or None, dummy(agr, set_state) -> works)
_KINDS: Dict[str, Tuple[Callable, Callable]] = {}
# Collectives that may run while some ranks have joined (they contribute zeros).  As in Horovod,
# allgather / broadcast / alltoall / reducescatter with joined ranks fail on the other ranks.
_JOIN_KINDS = {"allreduce", "grouped_allreduce"}


def register_kind(kind: str, validate: Callable, dummy: Callable) -> None:
    """Declare how to validate descriptors of ``kind`` and how to join its transfer as a dummy."""
    _KINDS[kind] = (validate, dummy)


def _encode(d: Desc) -> list:
    return [d.kind, d.name, d.op, d.dtype, [list(s) for s in d.shapes], _lists(d.extra), d.device]


def _lists(x: Any) -> Any:
    return [_lists(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def _decode(v: list) -> Desc:
    return Desc(v[0], v[1], v[2], v[3], tuple(tuple(s) for s in v[4]), _tuples(v[5]), v[6])


class Pending:
    """A submitted collective: ``poll()`` without blocking, ``wait()`` for its result."""

    __slots__ = ("st", "plan", "key", "t_us", "done", "result", "err", "agr", "event", "t_submit",
                 "detached", "traced", "start_at")

    def __init__(self, st: "SetState", plan: Plan, key: tuple) -> None:
        self.st, self.plan, self.key = st, plan, key
        self.t_us = time.time_ns() // 1000
        self.t_submit = time.monotonic()
        self.done = False
        self.result: Any = None
        self.err: Optional[BaseException] = None
        self.agr: Optional[Agreement] = None
        self.event = threading.Event()
        self.detached = False
        self.start_at = self.t_submit + _GRACE  # when the background thread may drive it
        self.traced = True  # timeline events (the optimizer's buckets report their own)

    def detach(self, cycle: bool = True) -> "Pending":
        """The caller will not wait right away (an async handle): let the background thread drive
        the op after one cycle time (``cycle``; at once without it, for the optimizer's buckets),
        so it progresses while the caller computes."""
        if not self.detached and not self.done:
            self.detached = True
            self.start_at = self.t_submit + (_CYCLE if cycle else 0.0)
            with self.st.lock:
                self.st._wake()
        return self

    def poll(self) -> bool:
        """True when ``wait()`` will not block."""
        if self.done:
            self._observed()
        return self.done

    def wait(self) -> Any:
        """Block until done; return the result or raise (``HorovodInternalError`` for failures)."""
        if not self.done:
            self.st._drive_until(self)
        self._observed()
        if self.err is not None:
            raise self.err
        return self.result

    def _observed(self) -> None:
        st = self.st
        if st.unobserved.get(self.plan.name, (None,))[0] is self:
            st.unobserved.pop(self.plan.name, None)

    def _finish(self, result: Any = None, err: Optional[BaseException] = None) -> None:
        self.result, self.err = result, err
        st = self.st
        st.inflight.pop(self.plan.name, None)
        if self.detached and self.plan.desc.name:
            now = time.monotonic()
            if len(st.unobserved) >= 1024:  # handles that are never looked at: forget stale ones
                for name, (_, t) in list(st.unobserved.items()):
                    if now - t >= _REUSE_GRACE:
                        st.unobserved.pop(name, None)
            st.unobserved[self.plan.name] = (self, now)
        self.done = True
        self.event.set()
        if hooks.active and self.traced:
            if err is not None:
                hooks.emit(hooks.OP_END, self.plan.name, error=str(err))
            else:
                hooks.emit(hooks.OP_END, self.plan.name)


class SetState:
    """The coordinator of one process set on this rank: queue, rounds, cache, join, transports.

    Created when the set is registered (collective over its ranks), closed by ``close()``.
    """

    def __init__(self, set_id: int, ranks: Sequence[int], me: int, pg: Any, ctl: Any) -> None:
        self.set_id = set_id
        self.pg = pg                  # data group
        self.ctl = ctl                # gloo control group
        self.n = len(ranks)
        self.me = me                  # this rank's index in ``ranks``
        self.ranks = list(ranks)
        self.inflight: Dict[str, float] = {}       # name -> submission time (stall inspector)
        # name -> (op, finish time) of async ops that finished before their handle was looked at
        self.unobserved: Dict[str, Tuple[Pending, float]] = {}
        self.lock = threading.Lock()               # guards the local queue below
        self.drive_lock = threading.Lock()         # held by the one thread running rounds
        self.cv = threading.Condition(self.lock)
        self.fresh: Deque[Pending] = collections.deque()  # submitted, not announced yet
        self.mine: Dict[tuple, Pending] = {}        # announced, not finished
        self.unnamed = itertools.count()
        self.barriers = itertools.count()
        # identical on every rank (updated from the exchanged messages only):
        self.table: List[Desc] = []                 # response cache: id -> descriptor
        self.index: Dict[Desc, int] = {}            # descriptor -> id
        self.announced: List[Dict[tuple, Tuple[Desc, int]]] = [dict() for _ in range(self.n)]
        self.order: Dict[tuple, None] = {}          # keys in first-announcement order
        self.joined = [False] * self.n
        self.join_round = [0] * self.n
        self.rounds = 0
        self.verify_rounds = 0                      # rounds that carried full descriptors
        # this rank:
        self.joining = False
        self.join_result: Optional[int] = None
        self.broken: Optional[str] = None
        # the peer's failure that broke the set (typed: ``knock_on``/``peer``), copied onto every
        # error raised afterwards so that the launcher sees this rank's failure as a knock-on
        self.broken_by: Optional[HorovodInternalError] = None
        self.closed = False
        self.thread: Optional[threading.Thread] = None
        self.exchange: Any = None
        self.shm: Optional[_shm.Transport] = None
        self.mesh: Optional[_mesh.Mesh] = None      # allreduce data over the TCP mesh
        self.hosts: Optional[_hierarchical.HostAwareAllreduce] = None  # across hosts, host-aware
        self.pids: Optional[List[int]] = None
        self.watch: Optional[liveness.Watch] = None  # the peers' beats (frozen-rank detection)
        if self.n > 1:
            self.exchange, self.pids, self.mesh = _exchange.create(self)
            self.watch = _watch(self)
            # data through shared memory only with the shared-memory exchange (so
            # HOROVOD_COMPAT_SHM_CONTROL=0 turns both off, as documented)
            if isinstance(self.exchange, _exchange.ShmExchange):
                self.shm = _shm.create(self)
            elif isinstance(self.exchange, _exchange.TcpExchange):
                self.hosts = _hierarchical.create(self, self.mesh)

    # -- submission ---------------------------------------------------------------------------
    def submit(self, plan: Plan, traced: bool = True) -> Pending:
        if self.broken is not None:
            raise self._error(self.broken)
        if self.closed:
            raise HorovodInternalError(SHUT_DOWN_MESSAGE.format(op=plan.desc.kind))
        name = plan.name
        with self.lock:
            recent = self.unobserved.pop(name, None)
            if name in self.inflight or (recent is not None
                                         and time.monotonic() - recent[1] < _REUSE_GRACE):
                if recent is not None:
                    self.unobserved[name] = recent
                raise ValueError(DUPLICATE_NAME_MESSAGE.format(kind=plan.desc.kind, name=name))
            key = (plan.desc.name,) if plan.desc.name else ("", next(self.unnamed))
            p = Pending(self, plan, key)
            p.traced = traced
            self.inflight[name] = p.t_submit
            if self.n > 1:
                self.fresh.append(p)
        if hooks.active and traced:
            hooks.emit(hooks.NEGOTIATE_START, name, kind=plan.desc.kind)
        if self.n == 1:
            self._execute(p, Agreement((plan.desc,)), [p.t_us])
        return p

    def _wake(self) -> None:
        """Make sure the background thread looks at the queue (called with ``lock`` held)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._background, daemon=True,
                                           name=f"horovod_compat-coordinator-{self.set_id}")
            self.thread.start()
        self.cv.notify()

    def _has_work(self) -> bool:
        return bool(self.fresh or self.mine)

    # -- driving ------------------------------------------------------------------------------
    def _drive_until(self, p: Pending) -> None:
        """Run rounds in this thread until ``p`` is done (or wait while another thread runs them)."""
        while not p.done:
            if self.drive_lock.acquire(blocking=False):
                try:
                    while not p.done:
                        self._round_or_fail()
                finally:
                    self.drive_lock.release()
                with self.lock:
                    if self._has_work():
                        self._wake()
            else:
                p.event.wait(0.05)

    def _background(self) -> None:
        while True:
            with self.lock:
                while not self.closed and not self._has_work():
                    self.cv.wait()
                if self.closed:
                    return
                # ops not announced yet wait for their start time: a synchronous op is normally
                # driven by its own thread, async ones gather for one cycle
                if self.fresh and not self.mine:
                    left = min(q.start_at for q in self.fresh) - time.monotonic()
                    if left > 0:
                        self.cv.wait(left)
                        continue
            if not self.drive_lock.acquire(timeout=0.05):
                continue
            try:
                while not self.closed and self.broken is None and self._has_work():
                    self._round_or_fail()
            except HorovodInternalError:
                pass  # recorded on the ops (and in ``broken``)
            finally:
                self.drive_lock.release()

    def _round_or_fail(self) -> None:
        if self.broken is not None:
            self._fail_all(self.broken)
            raise self._error(self.broken)
        if self.closed:
            self._fail_all(SHUT_DOWN_MESSAGE.format(op="process"))
            raise HorovodInternalError(SHUT_DOWN_MESSAGE.format(op="process"))
        try:
            progressed = self._round()
        except HorovodInternalError as exc:  # the exchange broke: a peer died, left or froze
            self._break(str(exc), self._peer_loss(exc))
            raise
        except Exception as exc:  # the exchange failed: a peer died or left
            lost = peer_failure(f"a rank of process set {self.ranks} stopped responding (its "
                                f"process ended, or it left the job) while this rank negotiated "
                                f"with it: {exc}", self._departed())
            self._break(str(lost), lost)
            raise self._error(self.broken) from exc
        if not progressed:
            time.sleep(0.0002)  # nothing agreed: the others are still computing

    def _break(self, msg: str, cause: Optional[BaseException] = None) -> None:
        """The set is unusable from now on (``msg``); ``cause``, a ``peer_failure``, when a
        peer's failure broke it: every later error of the set is typed as its knock-on."""
        if self.broken is None:
            self.broken = msg
            if getattr(cause, "knock_on", False):
                self.broken_by = cause  # type: ignore[assignment]
        self._fail_all(self.broken)

    def _error(self, msg: str) -> HorovodInternalError:
        """``HorovodInternalError(msg)``, a knock-on of the peer failure that broke the set if one
        did."""
        cause = self.broken_by
        if cause is None:
            return HorovodInternalError(msg)
        return peer_failure(msg, cause.peer, cause.frozen)

    def _departed(self) -> Optional[int]:
        """The global rank of a peer of this set known to have left the job (its ``bye`` in the
        shared-memory exchange) or whose process ended (this host's peers), if any."""
        gone = getattr(self.exchange, "departed", None)
        j = gone() if callable(gone) else None
        if j is None and self.pids:
            j = next((i for i, pid in enumerate(self.pids)
                      if i != self.me and not procfs.alive(pid)), None)
        return None if j is None else self.ranks[j]

    def _peer_loss(self, exc: HorovodInternalError) -> HorovodInternalError:
        """``exc``, raised by the set's exchange or a transfer, marked (in place) as the knock-on
        of a peer's failure -- naming the peer when this rank can tell which one left or died --
        unless it already says what it is, or this rank is the one shutting down."""
        ex = self.exchange
        leaving = self.closed or getattr(ex, "leaving", False) or getattr(getattr(ex, "mesh", None),
                                                                          "leaving", False)
        if not exc.knock_on and not leaving:
            exc.knock_on, exc.peer = True, self._departed()
        return exc

    def _fail_all(self, msg: str) -> None:
        with self.lock:
            ops = list(self.fresh) + list(self.mine.values())
            self.fresh.clear()
            self.mine.clear()
        for p in ops:
            if not p.done:
                p._finish(err=self._error(msg))

    # -- one round ----------------------------------------------------------------------------
    def _round(self) -> bool:
        """Exchange messages once and run every op that became ready.  True if anything ran or
        was announced."""
        words, blob = self._message()
        got = self.exchange.gather(words, blob)
        self.rounds += 1
        new = self._absorb(got)
        ran = self._run_ready()
        return new or ran

    def _message(self) -> Tuple[List[int], bytes]:
        flags = JOINED if self.joining else 0
        words = [flags, 0, 0]
        misses: List[list] = []
        size = 2
        with self.lock:
            while self.fresh and len(words) + 3 <= _exchange.WORDS:
                p = self.fresh[0]
                d = p.plan.desc
                cid = self.index.get(d)
                if cid is None:
                    enc = _encode(d)
                    need = len(json.dumps(enc)) + 2
                    if misses and size + need > self.exchange.blob_capacity:
                        break
                    if size + need > self.exchange.blob_capacity:
                        self.fresh.popleft()
                        p._finish(err=ValueError(f"{d.kind} {p.plan.name!r}: too many tensors "
                                                 "in one grouped operation"))
                        continue
                    size += need
                    misses.append(enc)
                    cid = -len(misses)
                self.fresh.popleft()
                self.mine[p.key] = p
                words += [cid, p.key[1] if not p.key[0] else -1, p.t_us]
        words[1] = (len(words) - 3) // 3
        return words, (json.dumps(misses).encode() if misses else b"")

    def _absorb(self, got: Sequence[Tuple[List[int], bytes]]) -> bool:
        """Record every rank's newly announced ops and flags; update the response cache."""
        new = False
        learned: List[Desc] = []
        for r, (words, blob) in enumerate(got):
            flags, count = words[0], words[1]
            if flags & JOINED and not self.joined[r]:
                self.join_round[r] = self.rounds
            self.joined[r] = bool(flags & JOINED)
            if not count:
                continue
            new = True
            misses = [_decode(v) for v in json.loads(blob)] if blob else []
            learned.extend(misses)
            table, ann, order = self.table, self.announced[r], self.order
            for i in range(3, 3 + 3 * count, 3):
                cid, seq, t_us = words[i], words[i + 1], words[i + 2]
                d = table[cid] if cid >= 0 else misses[-cid - 1]
                key = (d.name,) if seq < 0 else ("", seq)
                ann[key] = (d, t_us)
                if key not in order:
                    order[key] = None
        if learned:
            self.verify_rounds += 1
            if _CACHE_CAPACITY > 0:
                if len(self.table) + len(learned) > _CACHE_CAPACITY:
                    self.table, self.index = [], {}
                for d in learned:
                    if d not in self.index and len(self.table) < _CACHE_CAPACITY:
                        self.index[d] = len(self.table)
                        self.table.append(d)
        return new

    def _run_ready(self) -> bool:
        live = [r for r in range(self.n) if not self.joined[r]]
        if not live:  # everybody joined: the join ends
            if self.joining:
                latest = max(self.join_round)
                last = max(r for r in range(self.n) if self.join_round[r] == latest)
                self.join_result = self.ranks[last]
                self.joining = False
                # nothing is in flight anywhere now: unnamed ops pair from position 0 again, so ops
                # that only some ranks submitted while others were joined (and that failed) do not
                # shift the pairing of every later unnamed op
                with self.lock:
                    self.unnamed = itertools.count()
            return True
        if not self.order:
            return False
        ready = [k for k in self.order if all(k in self.announced[r] for r in live)]
        for key in ready:
            del self.order[key]
            got = [self.announced[r].pop(key, None) for r in range(self.n)]
            descs = tuple(g[0] if g is not None and not self.joined[r] else None
                          for r, g in enumerate(got))
            ticks = [g[1] if g is not None else None for g in got]
            err = _validate(self, descs)
            if isinstance(err, mismatch.Mismatch):
                err = self._describe(err, key, descs)
            with self.lock:
                p = self.mine.pop(key, None)
            if err is not None:
                if p is not None:
                    p._finish(err=HorovodInternalError(err))
                continue
            agr = Agreement(descs)
            if p is not None:
                self._execute(p, agr, ticks)
            else:  # joined: contribute the kind's zeros
                with torch.no_grad():
                    for w in _KINDS[agr.template(self.me).kind][1](agr, self):
                        self._await(w, agr.template(self.me).device)
        return bool(ready)

    def _describe(self, m: mismatch.Mismatch, key: tuple, descs: Sequence[Optional[Desc]]) -> str:
        """The text of mismatch ``m`` of op ``key``, the same on every rank.  For an unnamed op the
        ranks first exchange its automatic names (ranks that diverged earlier number their unnamed
        ops differently): one more exchange, on this slow path only -- every rank, joined ones
        included, finds the mismatch in the same round, so they all take part.  The op stays in
        ``mine`` meanwhile, so that an exchange that breaks fails it."""
        first = next(d for d in descs if d is not None)
        auto = None
        if not key[0]:
            with self.lock:
                p = self.mine.get(key)
            got = self.exchange.gather([0, 0, 0], p.plan.name.encode() if p is not None else b"")
            auto = [blob.decode() if blob and descs[r] is not None else None
                    for r, (_words, blob) in enumerate(got)]
        return m.text(first.kind, len(first.shapes), key[0], auto, self.ranks)

    def _execute(self, p: Pending, agr: Agreement, ticks: List[Optional[int]]) -> None:
        plan = p.plan
        p.agr = agr
        if hooks.active and p.traced:
            hooks.emit(hooks.ALL_READY, plan.name, ranks=self.ranks, ready_us=ticks)
            _emit_start(plan)
        try:
            # grad mode is per thread and the driving thread may be the background one: data
            # movement never records autograd history (the autograd Functions wrap the ops)
            with torch.no_grad():
                works = plan.launch(agr)
                for w in works:
                    self._await(w, plan.desc.device)
                result = plan.finish(agr)
        except HorovodInternalError as exc:
            if not exc.knock_on and self._departed() is not None:
                self._peer_loss(exc)  # the transfer failed as a peer left or died
            p._finish(err=exc)
            return
        except Exception as exc:
            message = f"{plan.desc.kind} {plan.name!r} failed: {exc}"
            # a transport error (a peer died mid-transfer): nothing later can be trusted
            transport = isinstance(exc, RuntimeError) and self.n > 1
            err = peer_failure(message, self._departed()) if transport else HorovodInternalError(message)
            err.__cause__ = exc
            # The error's traceback keeps its frames, whose locals held the transfer and, through
            # it, the group: in that reference cycle (this set -> err -> frames -> this set) the
            # group's connections stayed open after hvd.shutdown(), and a peer still waiting for
            # this rank's data waited until it found this rank silent (30 s).
            traceback.clear_frames(exc.__traceback__)
            works = w = None  # noqa: F841 - this frame's own locals, kept by that traceback
            p._finish(err=err)
            if transport:
                self._break(str(err), err)
            return
        p._finish(result=result)

    def _await(self, w: Any, device: str) -> None:
        """Wait for transfer ``w``.  A gloo transfer (CPU tensors) is waited for in slices, checking
        between them that the set's peers still show signs of life (``liveness``) and are still in
        the job: a frozen peer, or one that left (``_departed``) and whose data has not come
        within ``DEPARTED_GRACE_SECONDS``, raises instead of leaving this rank in gloo's wait until
        its timeout.  NCCL's own watchdog covers GPU transfers."""
        watch = self.watch
        if watch is None or not watch.enabled or device != "cpu" or not isinstance(w, _Work):
            w.wait()
            return
        departed_at: Optional[float] = None
        while True:
            try:
                w.wait(_SLICE)
                return
            except RuntimeError:
                if w.is_completed():
                    # failed, or finished just after the slice ran out: its own outcome
                    w.wait()
                    return
            try:
                gone = self._departed()
                if gone is None:
                    watch.check(range(self.n), f"a transfer of process set {self.ranks}")
                else:  # not frozen: it stopped beating because it left
                    departed_at = departed_at or time.monotonic()
                    if time.monotonic() - departed_at >= DEPARTED_GRACE_SECONDS:
                        raise peer_failure(
                            f"rank {gone} left the job while this rank waited for its data in a "
                            f"transfer of process set {self.ranks}", peer=gone)
            except HorovodInternalError as exc:
                # the group's pending transfer can never complete: nothing later can be trusted,
                # and destroying the group would wait for that transfer (_keep_forever)
                _keep_forever(self.pg)
                self._break(str(exc), exc)
                raise

    def barrier(self) -> None:
        """Block until every rank of the set reached this point (an op with no data)."""
        plan = _Barrier()
        plan.desc = Desc("barrier", "", -1, "", ())
        plan.name = f"barrier.noname.{next(self.barriers)}"
        self.submit(plan).wait()

    # -- join ---------------------------------------------------------------------------------
    def join(self) -> int:
        """This rank has no more data: serve the other ranks' ops with zeros until every rank has
        joined.  Returns the global rank of the last rank to join."""
        if self.n == 1:
            return self.ranks[0]
        with self.drive_lock:
            while True:
                with self.lock:
                    if not self._has_work():
                        break
                self._round_or_fail()
            self.inflight["join"] = time.monotonic()
            self.joining = True
            self.join_result = None
            try:
                while self.join_result is None:
                    self._round_or_fail()
                return self.join_result
            finally:
                self.joining = False
                self.inflight.pop("join", None)

    # -- shutdown -----------------------------------------------------------------------------
    def close(self) -> None:
        """Leave: peers waiting for this rank raise; pending ops fail; the background thread
        stops; shared memory is released once no thread of ours can touch it."""
        if self.exchange is not None:
            self.exchange.leave()
        if self.hosts is not None:
            self.hosts.leave()
        with self.lock:
            self.closed = True
            self.cv.notify_all()
        self._fail_all(SHUT_DOWN_MESSAGE.format(op="process"))
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        idle = self.drive_lock.acquire(timeout=2.0)
        if idle and (thread is None or not thread.is_alive()):
            if self.exchange is not None:
                self.exchange.close()
            if self.shm is not None:
                self.shm.close()
            if self.hosts is not None:
                self.hosts.close()
            if self.watch is not None:
                self.watch.close()
            # No thread of ours uses the groups any more: let them go with the default group
            # (runtime.release_groups), even though this object may live on in a reference cycle.
            self.pg = self.ctl = None
        # else: a thread is still blocked in the exchange (its peers are gone too, so it fails
        # soon); the mappings and groups stay until the process exits rather than vanish under it
        if idle:
            self.drive_lock.release()


def _keep_forever(group: Any) -> None:
    """Never destroy ``group``, a gloo group with a transfer this rank gave up on: its destructor
    joins the group's worker thread, which stays in that transfer until the peer closes its
    connections -- never, if the peer is frozen -- and ``hvd.shutdown()`` (an elastic reset) or
    the interpreter's exit would hang there. One reference that is never dropped, not even when
    the interpreter finalizes, keeps it; the process's exit closes its connections."""
    if group is not None:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


class _Barrier(Plan):
    __slots__ = ()

    def launch(self, agr: Agreement) -> List[Any]:
        return []

    def finish(self, agr: Agreement) -> Any:
        return None


register_kind("barrier", lambda descs, st: None, lambda agr, st: [])


def _watch(st: SetState) -> Optional[liveness.Watch]:
    """The liveness view of set ``st`` (collective over its control group, after its exchange
    exists): its peers' beats travel where its negotiation does -- a small shared segment when
    its ranks share this host, the mesh's beat connections across hosts -- never through a
    service one rank hosts (the c10d store)."""
    ex, beats = st.exchange, None
    if isinstance(ex, _exchange.ShmExchange):
        try:
            beats = liveness.ShmBeats(_shm.map_segment(st, liveness.ShmBeats.size(st.n)), st.n,
                                      st.me)
        except OSError:
            beats = None  # every rank failed alike: the stopped-process check only
    elif isinstance(ex, _exchange.TcpExchange) and ex.mesh.beat_socks:
        beats = ex.mesh
    watch = liveness.Watch(st.ranks, st.me, beats, st.pids, lambda: _waiting_in(st))
    if isinstance(ex, _exchange.ShmExchange):
        ex.watch.attach(watch, pending=ex.pending)
    elif isinstance(ex, _exchange.TcpExchange):
        ex.mesh.attach(watch, st.ranks)
    return watch


def _waiting_in(st: SetState) -> str:
    """The ops this rank waits for in set ``st``, for the messages."""
    names = [name for name, _t in sorted(list(st.inflight.items()), key=lambda item: item[1])]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _emit_start(plan: Plan) -> None:
    d = plan.desc
    info = dict(kind=d.kind, dtype=d.dtype, shape=d.shapes[0] if len(d.shapes) == 1 else d.shapes,
                op=d.op)
    be = plan.transport()
    if be is not None:
        info["backend"] = be
    if d.kind.startswith("grouped_"):
        k = len(d.shapes)
        info["tensor_names"] = [f"{plan.name}_{i}of{k}" for i in range(k)]
    hooks.emit(hooks.OP_START, plan.name, **info)


def _validate(st: SetState, descs: Sequence[Optional[Desc]]) -> Any:
    """None when every rank's descriptor of an op agrees, else a ``mismatch.Mismatch`` (or the
    text of an op not allowed while some ranks joined)."""
    live = [d for d in descs if d is not None]
    first = live[0]
    if any(d.kind != first.kind for d in live):
        return mismatch.kind([d.kind.upper() if d is not None else None for d in descs])
    if any(d.device != first.device for d in live):
        return mismatch.device([d.device if d is not None else None for d in descs])
    if len(live) < len(descs) and first.kind not in _JOIN_KINDS:
        return f"{first.kind} is not supported while some ranks have called hvd.join()"
    return _KINDS[first.kind][0](descs, st)


def submit(st: SetState, plan: Plan, traced: bool = True) -> Pending:
    """Queue ``plan`` on its process set; returns its ``Pending``."""
    return st.submit(plan, traced)


def join(st: SetState) -> int:
    """``hvd.join()`` on process set ``st``."""
    return st.join()
