"""Cross-rank agreement for every collective, cheap enough for a training loop, and the stall inspector.

What must hold (Horovod's behaviour): when ranks submit the same collective with different shapes,
dtypes, reduce ops (or different collectives/names), EVERY rank raises ``HorovodInternalError``
with Horovod's message, nothing hangs, good ranks' in-place tensors are not corrupted, and later
collectives still work.  What it must cost: next to nothing in a loop that repeats the same
collectives.

Design (our own):

* Every collective has a *descriptor* ``Desc`` (kind, user name or "" for unnamed ops, reduce op,
  dtype, shapes, kind-specific extras) and a cache *key* ``(kind, name)``.
* Each process set keeps a cache ``key -> Agreement`` (the descriptors of all ranks that were last
  verified for that key).  The cache is updated only in *verification rounds*, which every rank runs
  together with identical inputs, so all ranks always hold identical caches.
* Every collective sends ONE tiny control message (2 int64: status bits + 63-bit key hash) with an
  asynchronous ``all_gather`` on the set's control group.  A rank whose descriptor equals its cached
  one is a *hit*.  For the hot kinds (allreduce, allgather, reducescatter, alltoall) a hit launches
  the data transfer *speculatively*, at the same time as the control message, so the control
  latency overlaps the transfer instead of adding to it.
* A rank whose descriptor changed for a cached key knows what the others will send (the cache is
  identical everywhere), so it joins the speculative transfer with a *dummy* of the cached shape
  filled with the op's identity element (0 for sums, +max for Min, ...); the good ranks' buffers
  come out unchanged.  A rank with an unknown key learns from the control message which cached key
  the others launched and joins with the matching dummy.
* When the control message shows anything but "all hit the same key", every rank discards the
  speculative result and runs a verification round (``all_gather_object`` of full descriptors):
  either they all agree (the new agreement is cached and the op runs for real) or the per-kind
  validator produces Horovod's error message and every rank raises ``HorovodInternalError``.
  Nothing is left half-done on any group, so the job keeps working.
* Ranks that called ``hvd.join()`` answer control messages with a "joined" bit and contribute
  zeros to the collectives of the others.

Known limit: if two ranks submit *different names that are both cached* at the same position (a
program bug that Horovod answers with a stall), both launch speculative transfers; when their
sizes differ the data group may hang -- the stall inspector then names the ranks and tensors, as
Horovod's does.  Collectives must be submitted in the same order on every rank (torch.distributed's
rule); Horovod's reordering of async ops by name is not reproduced.

The stall inspector (``HOROVOD_STALL_CHECK_TIME_SECONDS``, default 60; ``..._SHUTDOWN_TIME_SECONDS``,
default 0 = never; ``HOROVOD_STALL_CHECK_DISABLE=1``) is a daemon thread: every tick, a rank with a
collective older than the check time posts its pending tensor names to the rendezvous store, reads
the other ranks' posts and prints which ranks are missing which tensors.  After the shutdown time it
prints an error and ends the process (exit code 1) so the launcher stops the job.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import hooks
from .exceptions import HorovodInternalError

__all__ = ["Desc", "Agreement", "SetState", "Plan", "Pending", "register_kind", "submit", "join",
           "DUPLICATE_NAME_MESSAGE"]

DUPLICATE_NAME_MESSAGE = (
    "Requested to {kind} a tensor with the same name as another tensor that is currently being "
    "processed.  If you want to request another tensor, use a different tensor name. (name: {name})")

HIT, LAUNCHED, JOINED, JUST_JOINED = 1, 2, 4, 8


class Desc(NamedTuple):
    """What one rank asks for; equal descriptors on every rank mean the op is well-formed."""

    kind: str
    name: str            # user-given name, "" for unnamed ops (so unnamed ops can hit the cache)
    op: int              # Horovod reduce-op code, -1 when not a reduction
    dtype: str
    shapes: Tuple[Tuple[int, ...], ...]
    extra: tuple = ()

    @property
    def key(self) -> Tuple[str, str]:
        return (self.kind, self.name)


class Agreement(NamedTuple):
    """The descriptors of every rank of the set (None for joined ranks), last verified together."""

    descs: Tuple[Optional[Desc], ...]
    keyhash: int   # hash of the cache key (kind, name)
    agid: int = 0  # hash of the whole agreement (used for keys whose signature keeps changing)

    def template(self, index: int) -> Desc:
        """The descriptor rank ``index`` should use for a dummy contribution."""
        d = self.descs[index]
        return d if d is not None else next(x for x in self.descs if x is not None)


class Plan:
    """One submitted collective.  Subclasses (in ``collectives``) define the data transfer.

    ``launch(agr)`` starts the transfer with this rank's real tensors and returns torch Work
    objects; ``finish(agr)`` builds the result after they completed.
    """

    speculative = False
    __slots__ = ("desc", "name")

    def launch(self, agr: Agreement) -> List[Any]:
        raise NotImplementedError

    def finish(self, agr: Agreement) -> Any:
        raise NotImplementedError


# kind -> (validate(descs, set_state) -> error message or None, dummy(agr, set_state) -> works)
_KINDS: Dict[str, Tuple[Callable, Callable]] = {}


def register_kind(kind: str, validate: Callable, dummy: Callable) -> None:
    """Declare how to validate descriptors of ``kind`` and how to join its transfer as a dummy."""
    _KINDS[kind] = (validate, dummy)


_keyhashes: Dict[tuple, int] = {}


def _keyhash(key: tuple) -> int:
    h = _keyhashes.get(key)
    if h is None:
        h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") >> 2
        _keyhashes[key] = h
    return h


class SetState:
    """Negotiation state of one process set on this rank."""

    def __init__(self, ps: Any) -> None:
        self.ps = ps
        self.pg = ps._pg
        self.ctl = ps._ctl
        self.n = len(ps.ranks)
        self.me = ps._my_index
        self.ranks = list(ps.ranks)
        self.cache: Dict[tuple, Agreement] = {}
        self.by_hash: Dict[int, Agreement] = {}
        # Keys whose agreed signature changed at least once ("polymorphic", e.g. unnamed ops of
        # several shapes, or allgathers with varying first dimensions): every agreement seen is
        # kept per key (indexed by this rank's descriptor) and these keys never speculate: the
        # control message carries the agreement id and the data moves only after all ranks agreed.
        self.poly: Dict[tuple, Dict[Desc, Agreement]] = {}
        self.inflight: Dict[str, float] = {}
        self.verify_rounds = 0  # verification rounds run so far (tests check the loop is cheap)
        self.lock = threading.Lock()


class Pending:
    """A submitted collective: ``poll()`` without blocking, ``wait()`` for its result."""

    __slots__ = ("st", "plan", "agr", "works", "cw", "recv", "stage", "result", "kh", "hit")

    def __init__(self, st: SetState, plan: Plan) -> None:
        self.st = st
        self.plan = plan
        self.stage = 0  # 0: control in flight, 1: data in flight (agreed), 2: done
        self.result: Any = None
        self.works: Optional[List[Any]] = None
        self.cw: Any = None
        self.recv: Optional[torch.Tensor] = None

    # -- internal ---------------------------------------------------------------------------
    def _fast_ok(self) -> bool:
        """After the control message: did every rank hit the same key?"""
        g = self.recv.tolist()
        kh = self.kh
        for i in range(0, len(g), 2):
            if not (g[i] & HIT) or g[i + 1] != kh:
                return False
        return True

    def _to_stage1(self) -> bool:
        """Control message completed; True if we are on the fast path (data launched)."""
        if self._fast_ok():
            if hooks.active:
                hooks.emit(hooks.ALL_READY, self.plan.name)
            if self.works is None:
                self.works = self.plan.launch(self.agr)
                if hooks.active:
                    _emit_start(self.plan)
            self.stage = 1
            return True
        return False

    def _finish(self) -> Any:
        try:
            self.result = self.plan.finish(self.agr)
        finally:
            self._done()
        return self.result

    def _done(self) -> None:
        self.stage = 2
        self.st.inflight.pop(self.plan.name, None)
        if hooks.active:
            hooks.emit(hooks.OP_END, self.plan.name)

    # -- public -------------------------------------------------------------------------------
    def poll(self) -> bool:
        """True when ``wait()`` will not block on the transfer any more."""
        if self.stage == 2:
            return True
        if self.stage == 0:
            if not self.cw.is_completed():
                return False
            if not self._to_stage1():
                return True  # slow path: wait() finishes it (short control rounds)
        return all(w.is_completed() for w in self.works)

    def wait(self) -> Any:
        """Block until done; return the result or raise ``HorovodInternalError``."""
        if self.stage == 2:
            return self.result
        try:
            if self.stage == 0:
                self.cw.wait()
                if not self._to_stage1():
                    return self._slow()
            for w in self.works:
                w.wait()
        except HorovodInternalError:
            raise
        except Exception as exc:
            self._done()
            raise HorovodInternalError(f"{self.plan.desc.kind} {self.plan.name!r} failed: {exc}") from exc
        return self._finish()

    def _slow(self) -> Any:
        """Somebody missed: settle speculative transfers, verify all descriptors, run for real."""
        st, plan = self.st, self.plan
        g = self.recv.view(st.n, 2).tolist()
        try:
            _settle_speculation(st, g, self.works)
            descs = _exchange_descs(st, plan.desc)
            if hooks.active:
                hooks.emit(hooks.ALL_READY, plan.name)
            err = _validate(st, descs)
            if err is not None:
                raise HorovodInternalError(err)
            self.agr = _remember(st, descs)
            self.works = plan.launch(self.agr)
            if hooks.active:
                _emit_start(plan)
            for w in self.works:
                w.wait()
        except HorovodInternalError:
            self._done()
            raise
        except Exception as exc:
            self._done()
            raise HorovodInternalError(f"{plan.desc.kind} {plan.name!r} failed: {exc}") from exc
        return self._finish()


def _emit_start(plan: Plan) -> None:
    d = plan.desc
    info = dict(kind=d.kind, dtype=d.dtype, shape=d.shapes[0] if len(d.shapes) == 1 else d.shapes,
                op=d.op)
    if d.kind.startswith("grouped_"):
        k = len(d.shapes)
        info["tensor_names"] = [f"{plan.name}_{i}of{k}" for i in range(k)]
    hooks.emit(hooks.OP_START, plan.name, **info)


def _settle_speculation(st: SetState, g: List[List[int]], my_works: Optional[List[Any]]) -> None:
    """Make sure every speculative transfer launched by any rank has a partner, then drain it."""
    works = my_works
    if works is None:
        for code, kh in g:
            if code & LAUNCHED:
                agr = st.by_hash.get(kh)
                if agr is not None:
                    works = _KINDS[agr.template(st.me).kind][1](agr, st)
                break
    for w in works or ():
        w.wait()


def _exchange_descs(st: SetState, desc: Optional[Desc]) -> List[Optional[Desc]]:
    st.verify_rounds += 1
    out: List[Optional[Desc]] = [None] * st.n
    dist.all_gather_object(out, desc, group=st.ctl)
    return out


def _validate(st: SetState, descs: Sequence[Optional[Desc]]) -> Optional[str]:
    live = [(i, d) for i, d in enumerate(descs) if d is not None]
    first_i, first = live[0]
    for i, d in live[1:]:
        if d.kind != first.kind:
            return (f"Mismatched collective operations: One rank did an {first.kind.upper()}, but "
                    f"another rank did an {d.kind.upper()}.")
    for i, d in live[1:]:
        if d.name != first.name:
            return (f"Mismatched {first.kind.upper()} tensor names: rank {st.ranks[first_i]} "
                    f"submitted {first.name or '<unnamed>'!r}, but rank {st.ranks[i]} submitted "
                    f"{d.name or '<unnamed>'!r}.")
    if len(live) < len(descs) and first.kind not in _JOIN_KINDS:
        return f"{first.kind} is not supported while some ranks have called hvd.join()"
    return _KINDS[first.kind][0](descs, st)


_JOIN_KINDS = {"allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast"}


_POLY_LIMIT = 256


def _remember(st: SetState, descs: Sequence[Optional[Desc]]) -> Agreement:
    """Cache a verified agreement (every rank calls this with identical ``descs``)."""
    key = next(d for d in descs if d is not None).key
    descs = tuple(descs)
    agr = Agreement(descs, _keyhash(key), _keyhash((key, descs)))
    with st.lock:
        old = st.cache.get(key)
        st.cache[key] = agr
        st.by_hash[agr.keyhash] = agr
        alts = st.poly.get(key)
        if alts is None and old is not None and old.descs != descs:
            alts = st.poly[key] = {}
            if old.descs[st.me] is not None:
                alts[old.descs[st.me]] = old
        if alts is not None:
            if len(alts) >= _POLY_LIMIT:
                alts.pop(next(iter(alts)))
            if descs[st.me] is not None:
                alts[descs[st.me]] = agr
    return agr


def submit(st: SetState, plan: Plan) -> Pending:
    """Start negotiating (and, on a cache hit, transferring) ``plan``; returns its ``Pending``."""
    name = plan.name
    inflight = st.inflight
    if name in inflight:
        raise ValueError(DUPLICATE_NAME_MESSAGE.format(kind=plan.desc.kind, name=name))
    inflight[name] = time.monotonic()
    if hooks.active:
        hooks.emit(hooks.NEGOTIATE_START, name, kind=plan.desc.kind)
    p = Pending(st, plan)
    desc = plan.desc
    key = (desc.kind, desc.name)
    alts = st.poly.get(key)
    if alts is None:
        agr = st.cache.get(key)
        hit = agr is not None and agr.descs[st.me] == desc
        speculative = plan.speculative
    else:
        agr = alts.get(desc)
        hit = agr is not None and all(d is not None for d in agr.descs)
        speculative = False
    p.agr = agr
    try:
        if st.n == 1:
            if not hit:
                p.agr = _remember(st, [desc])
            p.cw = None
            p.works = plan.launch(p.agr)
            p.stage = 1
            return p
        code = HIT if hit else 0
        if agr is not None and speculative:
            p.works = plan.launch(agr) if hit else _KINDS[desc.kind][1](agr, st)
            code |= LAUNCHED
            if hit and hooks.active:
                _emit_start(plan)
        kh = p.kh = _keyhash(key) if alts is None or not hit else agr.agid
        send = torch.tensor([code, kh], dtype=torch.int64)
        p.recv = torch.empty(2 * st.n, dtype=torch.int64)
        p.cw = dist.all_gather_into_tensor(p.recv, send, group=st.ctl, async_op=True)
    except BaseException:
        inflight.pop(name, None)
        raise
    return p


def join(st: SetState) -> int:
    """This rank has no more data: serve the other ranks' collectives with zeros until every rank
    has joined.  Returns the global rank of the last rank to join."""
    name = "join"
    st.inflight[name] = time.monotonic()
    code = JOINED | JUST_JOINED
    try:
        while True:
            send = torch.tensor([code, 0], dtype=torch.int64)
            recv = torch.empty(2 * st.n, dtype=torch.int64)
            dist.all_gather_into_tensor(recv, send, group=st.ctl)
            g = recv.view(st.n, 2).tolist()
            code = JOINED
            if all(c & JOINED for c, _ in g):
                last = max(i for i, (c, _) in enumerate(g) if c & JUST_JOINED)
                return st.ranks[last]
            _settle_speculation(st, g, None)
            descs = _exchange_descs(st, None)
            if all(d is None for d in descs) or _validate(st, descs) is not None:
                continue  # the others raise; nothing more to do for this op
            agr = _remember(st, descs)
            for w in _KINDS[agr.template(st.me).kind][1](agr, st):
                w.wait()
    finally:
        st.inflight.pop(name, None)


# ----------------------------------------------------------------------------- stall inspector

_inspector: Optional["_StallInspector"] = None


class _StallInspector(threading.Thread):
    def __init__(self, store: Any, rank: int, check: float, shutdown: float) -> None:
        super().__init__(name="horovod_compat-stall-inspector", daemon=True)
        self.store = store
        self.rank = rank
        self.check = check
        self.shutdown = shutdown
        self.tick = max(0.2, min(check / 4.0, 2.0))
        self.stop_event = threading.Event()
        self.warned: Dict[str, float] = {}
        self.posted = False

    def run(self) -> None:
        while not self.stop_event.wait(self.tick):
            try:
                self._inspect()
            except Exception:  # the inspector must never take a healthy job down
                pass

    def _inspect(self) -> None:
        from . import process_sets

        now = time.monotonic()
        stalled: Dict[str, Tuple[float, Any]] = {}
        mine: List[str] = []
        for ps in list(process_sets._sets.values()):
            st = ps.negotiation
            if st is None:
                continue
            for name, t0 in list(st.inflight.items()):
                mine.append(name)
                if now - t0 > self.check:
                    stalled[name] = (now - t0, st)
        if mine and (stalled or any(now - t0 > self.check / 2 for ps in process_sets._sets.values()
                                    if ps.negotiation for t0 in ps.negotiation.inflight.values())):
            self.store.set(f"stall/{self.rank}", json.dumps([time.time(), sorted(mine)]))
            self.posted = True
        elif self.posted:
            self.store.set(f"stall/{self.rank}", json.dumps([time.time(), []]))
            self.posted = False
        if not stalled:
            return
        missing: Dict[int, List[str]] = {}
        worst = 0.0
        for name, (age, st) in stalled.items():
            worst = max(worst, age)
            for r in st.ranks:
                if r == self.rank:
                    continue
                if name not in self._posted_names(r):
                    missing.setdefault(r, []).append(name)
        new = [n for n in stalled if n not in self.warned]
        if new and missing:
            lines = "\n".join(f"{r}: [{', '.join(sorted(ns))}]" for r, ns in sorted(missing.items()))
            msg = (f"[horovod_compat rank {self.rank}] One or more tensors were submitted to be "
                   "reduced, gathered or broadcasted by subset of ranks and are waiting for "
                   f"remainder of ranks for more than {int(self.check)} seconds. This may indicate "
                   "that different ranks are trying to submit different tensors or that only "
                   "subset of ranks is submitting tensors, which will cause deadlock. \n"
                   f"Missing ranks:\n{lines}")
            print(msg, file=sys.stderr, flush=True)
            for n in new:
                self.warned[n] = time.monotonic()
        if self.shutdown > 0 and worst > max(self.shutdown, self.check):
            print(f"[horovod_compat rank {self.rank}] HorovodInternalError: stall shutdown time "
                  f"({self.shutdown:g} s, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS) exceeded waiting for "
                  f"{sorted(stalled)}; shutting down", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)

    def _posted_names(self, r: int) -> List[str]:
        key = f"stall/{r}"
        if not self.store.check([key]):
            return []
        t, names = json.loads(self.store.get(key).decode())
        if time.time() - t > 3 * self.tick + 1.0:
            return []
        return names


def start_stall_inspector() -> None:
    """Start the inspector thread for this init generation (called by ``hvd.init``)."""
    global _inspector
    from . import lifecycle

    if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "0") not in ("", "0"):
        return
    if lifecycle.state.size <= 1 and len(_all_sets()) <= 1:
        return
    store = lifecycle.control_store()
    if store is None:
        return
    check = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "60"))
    shutdown = float(os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0"))
    _inspector = _StallInspector(store, dist.get_rank(), check, shutdown)
    _inspector.start()


def stop_stall_inspector() -> None:
    """Stop the inspector thread (called by ``hvd.shutdown``)."""
    global _inspector
    if _inspector is not None:
        _inspector.stop_event.set()
        _inspector.join(timeout=5)
        _inspector = None


def _all_sets() -> Dict[int, Any]:
    from . import process_sets

    return process_sets._sets
