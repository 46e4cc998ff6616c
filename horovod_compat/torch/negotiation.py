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
* Every collective posts ONE control word (status bits, 63-bit key hash, and the rank's submission
  time in wall-clock µs, which the timeline shows as that rank's readiness tick) BEFORE any data
  moves.  When all ranks of the set share a host (the usual local case) the words live in a
  shared-memory ring (``_ShmControl``): posting is four memory stores and reading them costs no
  message;
  otherwise they travel with an async gloo ``all_gather`` on the set's control group
  (``_GlooControl``; ``HOROVOD_COMPAT_SHM_CONTROL=0`` forces it).  A rank whose descriptor equals
  its cached one is a *hit*.  For the hot kinds (allreduce, allgather, reducescatter, alltoall) a
  hit launches the data transfer *speculatively* right after posting; once that transfer completed,
  every participant's word is necessarily posted, so the check after it never waits.
* Keys whose agreed signature changes (unnamed ops used with several shapes, allgathers with varying
  first dimensions) become *polymorphic*: every agreement seen is kept, the control word carries the
  agreement id, and data moves only after every rank's word was read (no speculation, so differing
  signatures can never meet in a transfer).  After 8 consecutive identical agreements such a key
  becomes speculative again.
* A rank whose descriptor changed for a cached key knows what the others will send (the cache is
  identical everywhere), so it joins the speculative transfer with a *dummy* of the cached shape
  filled with the op's identity element (0 for sums, +max for Min, ...); the good ranks' buffers
  come out unchanged.  A rank with an unknown key learns from the control message which cached key
  the others launched and joins with the matching dummy.
* A rank's cache entry for a key is only trusted while no earlier op of that key, submitted here as
  a miss, is still waiting to be verified (async bursts of unnamed ops, whose shapes change):
  that verification may change the entry, and a rank that already ran it would speculate on the
  new agreement while this one used the old -- two transfers of different sizes, which gloo
  answers by aborting the process.  Such an op claims no hit and launches nothing.
* When the control message shows anything but "all hit the same key", every rank discards the
  speculative result and runs a verification round (``all_gather_object`` of full descriptors):
  either they all agree (the new agreement is cached and the op runs for real) or the per-kind
  validator produces Horovod's error message and every rank raises ``HorovodInternalError``.
  Nothing is left half-done on any group, so the job keeps working.
* Ranks that called ``hvd.join()`` answer control messages with a "joined" bit and contribute
  zeros to the collectives of the others.

Ordering: each rank's collectives take control slots in submission order, and handles may be
synchronized or polled in any order: before an op advances, every op queued before it on its set is
brought to "transfer launched" first, so control rounds happen in slot order everywhere.  When the
ranks reach a slot with *different* collectives (Horovod pairs ops by name, so e.g. one rank may
submit an async op before a barrier and another after it), the verification round also carries
each rank's other queued ops; if every rank has already submitted an op of one same (kind, name),
that op runs now and each rank's ops queued before it move to later slots, which every rank then
verifies (``_match_by_name``).  This needs the shared-memory control and no speculative transfer
among the ops concerned; otherwise, or when no op is common to all ranks, it is the mismatch error.

Known limit: if two ranks submit *different names that are both cached* at the same slot, both
launch speculative transfers before they can know; when their sizes differ the data group may hang
-- the stall inspector then names the ranks and tensors, as Horovod's does.  With equal sizes the
error is raised on every rank but in-place buffers may already hold the mixed result.  So
allreduces, allgathers, alltoalls and reducescatters submitted in different orders on different
ranks are paired by name the first time each name is seen (not yet cached), not in a loop.

The shared-memory control relies on x86-64/ARM64 store ordering of aligned
8-byte words written through ``memoryview`` (sequence word last): x86-64's total store order
guarantees it, so other architectures use the gloo control.

The stall inspector (``HOROVOD_STALL_CHECK_TIME_SECONDS``, default 60; ``..._SHUTDOWN_TIME_SECONDS``,
default 0 = never; ``HOROVOD_STALL_CHECK_DISABLE=1``) is a daemon thread: every tick, a rank with a
collective older than the check time posts its pending tensor names to the rendezvous store, reads
the other ranks' posts and prints which ranks are missing which tensors.  After the shutdown time it
prints an error and ends the process (exit code 1) so the launcher stops the job.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _shm, hooks
from .exceptions import HorovodInternalError

__all__ = ["Desc", "Agreement", "SetState", "Plan", "Pending", "register_kind", "submit", "join",
           "DUPLICATE_NAME_MESSAGE"]

DUPLICATE_NAME_MESSAGE = (
    "Requested to {kind} a tensor with the same name as another tensor that is currently being "
    "processed.  If you want to request another tensor, use a different tensor name. (name: {name})")

HIT, LAUNCHED, JOINED, JUST_JOINED = 1, 2, 4, 8

#: One rank's control word as read back: (status bits, key hash, submission time in wall-clock µs).
Word = Tuple[int, int, int]


class Desc(NamedTuple):
    """What one rank asks for; equal descriptors on every rank mean the op is well-formed."""

    kind: str
    name: str            # user-given name, "" for unnamed ops (so unnamed ops can hit the cache)
    op: int              # Horovod reduce-op code, -1 when not a reduction
    dtype: str
    shapes: Tuple[Tuple[int, ...], ...]
    extra: tuple = ()
    device: str = "cpu"  # device type of the tensors ("cpu" travels on gloo, "cuda" on NCCL)

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

    def transport(self) -> Optional[str]:
        """The timeline's name for what moves this op's data, when not the set's backend."""
        return None


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
        self.streak: Dict[tuple, Tuple[int, int]] = {}
        self.inflight: Dict[str, float] = {}
        self.queue: "collections.deque[Pending]" = collections.deque()  # stage-0 ops, in order
        self.verify_rounds = 0  # verification rounds run so far (tests check the loop is cheap)
        # key -> number of this rank's queued ops of that key submitted as misses and not processed
        # yet (see ``submit``)
        self.unsettled: Dict[tuple, int] = {}
        # control slots (shared-memory sequence numbers) whose posted words no longer describe the
        # op that will use them, after ops were matched by name out of order (see ``_match_by_name``):
        # every rank takes the slow path there, and nothing speculates while any is left
        self.stale: set = set()
        self.lock = threading.Lock()
        self.control: Any = _make_control(self)
        # data of eligible allreduces moves through shared memory when the control words do
        self.shm: Optional[_shm.Transport] = (
            _shm.create(self) if isinstance(self.control, _ShmControl) else None)

    def close(self) -> None:
        """Release this rank's shared-memory mappings (the set is being torn down)."""
        self.control.close()
        if self.shm is not None:
            self.shm.close()


class _GlooControl:
    """Control words exchanged with an async gloo all_gather on the set's control group (any
    placement: used when the set spans several hosts)."""

    def __init__(self, st: "SetState") -> None:
        self.group = st.ctl
        self.n = st.n

    def post(self, code: int, kh: int) -> Any:
        """Start exchanging this rank's word ``(code, kh, now in wall-clock µs)``; returns a token."""
        send = torch.tensor([code, kh, time.time_ns() // 1000], dtype=torch.int64)
        recv = torch.empty(3 * self.n, dtype=torch.int64)
        return (_gather(recv, send, group=self.group, async_op=True), recv)

    def ready(self, tok: Any) -> bool:
        return tok[0].is_completed()

    def result(self, tok: Any) -> List[Word]:
        """Every rank's word, in set order (waits for the exchange)."""
        tok[0].wait()
        g = tok[1].tolist()
        return list(zip(g[0::3], g[1::3], g[2::3]))

    def close(self) -> None:
        pass


class _ShmControl:
    """Control words in a shared-memory ring, for sets whose ranks all run on one host.

    Rank j's word for its s-th collective lives in slot ``s % RING`` of its row (``SLOT`` = 4 int64
    words, written as the literal 4 on the hot path): ``[s, code, kh, t_us]`` (``t_us``: submission
    time, wall-clock µs), written data-first, sequence-last (x86-64 keeps stores in order).  A reader
    waits until every row shows sequence s.  Because the word is posted before any data transfer
    starts, a rank whose speculative transfer completed can read everybody's word without waiting:
    the steady state costs no message at all.  A row's ``ack`` (lowest sequence whose words it has
    not read yet) stops a writer from lapping a slow reader.
    """

    RING = max(4, int(os.environ.get("HOROVOD_COMPAT_SHM_RING", "4096")))
    SLOT = 4  # int64 words per slot: sequence, code, key hash, submission time

    def __init__(self, mm: Any, n: int, me: int, pids: List[int]) -> None:
        self.mm = mm
        self.mv = memoryview(mm).cast("q")
        self.n, self.me = n, me
        self.pids = pids  # the ranks' process ids (the data transport watches them too)
        self.watch = _shm.PeerWatch(pids, me)
        self.seq = 0
        self.row = 1 + self.RING * self.SLOT  # ack word + ring
        self.unread: Dict[int, bool] = {}  # sequences posted here whose words are not read yet
        self.snap: Dict[int, List[Word]] = {}  # words read early (see _backpressure)

    def post(self, code: int, kh: int) -> int:
        """Publish this rank's word ``(code, kh, now in wall-clock µs)``; returns its sequence."""
        self.seq += 1
        s = self.seq
        if s > self.RING:
            self._backpressure(s - self.RING)
        mv = self.mv
        base = self.me * self.row + 1 + (s % self.RING) * 4
        mv[base + 1] = code
        mv[base + 2] = kh
        mv[base + 3] = time.time_ns() // 1000
        mv[base] = s
        self.unread[s] = True
        return s

    def _backpressure(self, s_old: int) -> None:
        """Wait until every peer has read the words of sequence ``s_old`` (whose slot we reuse).
        Meanwhile read our own pending words into ``snap``, so peers waiting on us progress too."""
        def caught_up() -> bool:
            for s in sorted(self.unread):
                if not self.ready(s):
                    break
                self.snap[s] = self._read(s)
            return all(self.mv[j * self.row] > s_old for j in range(self.n) if j != self.me)

        self.watch.wait(caught_up, "its peers to read the control words of earlier collectives")
        # every peer read sequence s_old, so all its words are posted: keep our own copy before
        # the slot is reused
        if s_old in self.unread:
            self.snap[s_old] = self._read(s_old)

    def ready(self, s: int) -> bool:
        mv, off = self.mv, 1 + (s % self.RING) * 4
        for j in range(self.n):
            if mv[j * self.row + off] != s:
                return False
        return True

    def _read(self, s: int) -> List[Word]:
        mv, row = self.mv, self.row
        out: List[Word] = []
        for o in range(1 + (s % self.RING) * 4, self.n * row, row):
            out.append((mv[o + 1], mv[o + 2], mv[o + 3]))
        self.unread.pop(s, None)
        mv[self.me * self.row] = min(self.unread) if self.unread else self.seq + 1
        return out

    def result(self, s: int) -> List[Word]:
        """Every rank's word of sequence ``s``, in set order (waits until all are posted)."""
        got = self.snap.pop(s, None)
        if got is not None:
            return got
        if not self.ready(s):
            self.watch.wait(lambda: self.ready(s), "the control words of a collective")
        return self._read(s)

    def close(self) -> None:
        try:
            self.mv.release()
            self.mm.close()
        except Exception:
            pass


_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _make_control(st: "SetState") -> Any:
    """Shared memory when every rank of the set is on this host (and /dev/shm exists), else gloo.

    Collective over the set: the ranks compare hostnames, the set's first rank creates the segment
    and shares its path; it is unlinked as soon as everybody mapped it, so nothing leaks.
    """
    import platform
    import socket

    hosts_ok = (os.environ.get("HOROVOD_COMPAT_SHM_CONTROL", "1") != "0"
                and os.path.isdir("/dev/shm")
                and platform.machine().lower() in ("x86_64", "amd64"))
    info = [None] * st.n
    dist.all_gather_object(info, (socket.gethostname(), hosts_ok, os.getpid()), group=st.ctl)
    if not all(i[1] for i in info) or len({i[0] for i in info}) != 1:
        return _GlooControl(st)
    try:
        mm = _shm.map_segment(st, st.n * (1 + _ShmControl.RING * _ShmControl.SLOT) * 8)
    except OSError:
        return _GlooControl(st)
    return _ShmControl(mm, st.n, st.me, [i[2] for i in info])


class Pending:
    """A submitted collective: ``poll()`` without blocking, ``wait()`` for its result."""

    __slots__ = ("st", "plan", "agr", "works", "tok", "g", "stage", "result", "kh", "hit", "err",
                 "miss_key")

    def __init__(self, st: SetState, plan: Plan) -> None:
        self.st = st
        self.plan = plan
        self.stage = 0  # 0: control in flight, 1: data in flight (agreed), 2: done
        self.result: Any = None
        self.err: Optional[BaseException] = None
        self.works: Optional[List[Any]] = None
        self.hit = False                         # True when ``works`` completed already
        self.tok: Any = None                     # control-exchange token
        self.g: Optional[List[Word]] = None     # every rank's (status bits, key hash, ready µs)
        self.miss_key: Optional[tuple] = None    # set while this op, submitted as a miss, is unsettled

    # -- internal ---------------------------------------------------------------------------
    def _fast_ok(self) -> bool:
        """After the control message: did every rank hit the same key?"""
        if self.g is None:
            self.g = self.st.control.result(self.tok)
        if self.st.stale and self.tok in self.st.stale:
            return False
        kh = self.kh
        for code, h, _t in self.g:
            if not (code & HIT) or h != kh:
                return False
        return True

    def _to_stage1(self) -> bool:
        """Control message completed; True if we are on the fast path (data launched)."""
        if self._fast_ok():
            if self.st.poly:
                _note_streak(self.st, self.plan.desc.key, self.agr)
            if hooks.active:
                _emit_ready(self.st, self.plan.name, self.g)
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

    def _settle_miss(self) -> None:
        """This op is being processed (whatever the outcome): its key's cache entry is final again."""
        if self.miss_key is not None:
            unsettled = self.st.unsettled
            unsettled[self.miss_key] -= 1
            if not unsettled[self.miss_key]:
                del unsettled[self.miss_key]
            self.miss_key = None

    def _unsettle(self) -> None:
        """This op goes back to waiting, unverified: no op of its key may claim a hit meanwhile."""
        if self.miss_key is None:
            key = self.plan.desc.key
            self.st.unsettled[key] = self.st.unsettled.get(key, 0) + 1
            self.miss_key = key

    def _done(self) -> None:
        self.stage = 2
        self.st.inflight.pop(self.plan.name, None)
        if hooks.active:
            hooks.emit(hooks.OP_END, self.plan.name)

    # -- ordering ---------------------------------------------------------------------------
    # Control rounds and non-speculative launches must happen in slot order on every rank,
    # whatever order the user synchronizes handles in (Horovod allows any order).  So before an
    # op advances, every op queued before it on the same set is brought to "transfer launched".
    # The queue holds exactly the ops in stage 0, in slot order; matching by name
    # (``_match_by_name``) may launch a later op first and move the head to a later slot.

    def _launch_blocking(self) -> None:
        """Stage 0 -> stage 1 (real transfer launched), or stage 2 with ``err``; may wait for peers."""
        self._settle_miss()
        try:
            spec = self.works
            if spec is not None:  # speculative: once it completed, all words are readable
                for w in spec:
                    w.wait()
            if not self._to_stage1():
                self._slow_launch()
            self.hit = self.works is spec  # the transfer in flight is the one already waited for
        except HorovodInternalError as exc:
            self.err = exc
            if self.stage != 2:
                self._done()
        except Exception as exc:
            self.err = HorovodInternalError(f"{self.plan.desc.kind} {self.plan.name!r} failed: {exc}")
            self.err.__cause__ = exc
            if self.stage != 2:
                self._done()

    def _launch_ready(self) -> bool:
        """Advance without waiting for peers; False if that is not possible yet."""
        if self.works is not None and not all(w.is_completed() for w in self.works):
            return False
        if not self.st.control.ready(self.tok):
            return False
        self._launch_blocking()
        return True

    def _advance(self, block: bool) -> bool:
        """Process the set's queue up to this op (which leaves stage 0); False when ``block`` is
        False and that would have to wait for peers."""
        q = self.st.queue
        while self.stage == 0:
            p = q[0]
            if block:
                p._launch_blocking()
            elif not p._launch_ready():
                return False
            if p.stage != 0 and q and q[0] is p:
                q.popleft()
        return True

    # -- public -------------------------------------------------------------------------------
    def poll(self) -> bool:
        """True when ``wait()`` will not block on the transfer any more."""
        if self.stage == 2:
            return True
        if self.stage == 0:
            if not self._advance(False):
                return False
            if self.stage == 2:
                return True  # failed: synchronize() raises
        return all(w.is_completed() for w in self.works)

    def wait(self) -> Any:
        """Block until done; return the result or raise ``HorovodInternalError``."""
        if self.stage == 0:
            self._advance(True)
        if self.stage == 2:
            if self.err is not None:
                raise self.err
            return self.result
        try:
            if not self.hit:
                for w in self.works:
                    w.wait()
        except Exception as exc:
            self._done()
            raise HorovodInternalError(f"{self.plan.desc.kind} {self.plan.name!r} failed: {exc}") from exc
        return self._finish()

    def _queued_after(self) -> tuple:
        """``(descriptor, slot, speculative transfer launched)`` of this rank's other waiting ops
        of the set, in slot order (what ``_match_by_name`` may pair by name)."""
        if not isinstance(self.st.control, _ShmControl):
            return ()
        return tuple((p.plan.desc, p.tok, p.works is not None)
                     for p in self.st.queue if p is not self and p.stage == 0)

    def _launch_verified(self, descs: Sequence[Optional[Desc]]) -> None:
        """Every rank's descriptor for this op is known: stage 1 if they agree, else Horovod's
        mismatch error (``HorovodInternalError``)."""
        err = _validate(self.st, descs)
        if err is not None:
            raise HorovodInternalError(err)
        self.agr = _remember(self.st, descs)
        self.works = self.plan.launch(self.agr)
        self.stage = 1
        if hooks.active:
            _emit_start(self.plan)

    def _slow_launch(self) -> None:
        """Somebody missed: settle speculative transfers, verify all descriptors, launch for real."""
        st, plan = self.st, self.plan
        try:
            _settle_speculation(st, self.g, self.works)
            st.stale.discard(self.tok)
            descs, queued = _exchange_descs(st, plan.desc, self._queued_after())
            if _keys_differ(descs):
                chosen = _match_by_name(st, self, descs, queued)
                if chosen is not None and chosen[0] is not self:
                    return  # another op ran; this one waits for a later slot (still stage 0)
                if chosen is not None:
                    descs = chosen[1]
            if hooks.active:
                _emit_ready(st, plan.name, self.g)
            self._launch_verified(descs)
        except HorovodInternalError:
            raise
        except Exception as exc:
            raise HorovodInternalError(f"{plan.desc.kind} {plan.name!r} failed: {exc}") from exc


def _emit_ready(st: SetState, name: str, g: Sequence[Word]) -> None:
    """``ALL_READY`` with every rank's submission time from the control words (None for ranks that
    joined: they did not submit this op)."""
    hooks.emit(hooks.ALL_READY, name, ranks=st.ranks,
               ready_us=[None if code & JOINED else t for code, _kh, t in g])


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


def _settle_speculation(st: SetState, g: Sequence[Word], my_works: Optional[List[Any]]) -> None:
    """Make sure every speculative transfer launched by any rank has a partner, then drain it."""
    works = my_works
    if works is None:
        for code, kh, _t in g:
            if code & LAUNCHED:
                agr = st.by_hash.get(kh)
                if agr is not None:
                    works = _KINDS[agr.template(st.me).kind][1](agr, st)
                break
    for w in works or ():
        w.wait()


def _exchange_descs(st: SetState, desc: Optional[Desc], queued: tuple = ()
                    ) -> Tuple[List[Optional[Desc]], List[tuple]]:
    """Verification round: every rank's descriptor for the current slot (None: joined), and what
    each rank has queued after it (``Pending._queued_after``)."""
    st.verify_rounds += 1
    out: List[Any] = [None] * st.n
    dist.all_gather_object(out, None if desc is None else (desc, queued), group=st.ctl)
    return [o and o[0] for o in out], [o[1] if o else () for o in out]


def _keys_differ(descs: Sequence[Optional[Desc]]) -> bool:
    keys = {d.key for d in descs if d is not None}
    return len(keys) > 1


def _match_by_name(st: SetState, head: Pending, descs: Sequence[Optional[Desc]],
                   queued: Sequence[tuple]) -> Optional[Tuple[Pending, List[Desc]]]:
    """The ranks are at the same control slot with different collectives.  Horovod pairs
    collectives by name, not by position: if every rank has already submitted an op of one same
    (kind, name), run that one now -- the first such key in the lowest rank's submission order --
    and move each rank's ops that were queued before it to later slots.  Returns this rank's
    chosen op and every rank's descriptor for it, or None (then the mismatch is an error).

    Every rank computes the same answer from the same exchanged data.  Only possible with the
    shared-memory control (slots are sequence numbers) and when no rank launched a speculative
    transfer for any of the ops concerned (data transfers must keep one order on every rank, and a
    speculative transfer at this slot already combined different ops' data).
    """
    if (not isinstance(st.control, _ShmControl) or any(d is None for d in descs)
            or any(code & LAUNCHED for code, _kh, _t in head.g)):
        return None  # a speculative transfer already mixed the ops' data: an error, as before
    lists = [[(d, None, False)] + list(q) for d, q in zip(descs, queued)]
    if any(spec for lst in lists for _d, _slot, spec in lst[1:]):
        return None
    key = next((d.key for d, _s, _x in lists[0]
                if all(any(e[0].key == d.key for e in lst) for lst in lists)), None)
    if key is None:
        return None
    at = [next(i for i, e in enumerate(lst) if e[0].key == key) for lst in lists]
    chosen_descs = [lst[i][0] for lst, i in zip(lists, at)]
    # Every queued op of every rank now waits for a slow-path slot: its posted word (and any hit
    # it claimed) may describe another op.
    st.stale.update(slot for lst in lists for _d, slot, _x in lst[1:])
    mine = [head] + [p for p in st.queue if p is not head and p.stage == 0]
    k = at[st.me]
    chosen = mine[k]
    for p in mine:
        if p is not chosen:
            p._unsettle()
    if k > 0:
        # ops queued before the chosen one shift to the slots of their successors
        toks = [p.tok for p in mine[1:k + 1]]
        for p, tok in zip(mine[:k], toks):
            p.tok, p.g = tok, None
        head.g = None
        chosen._settle_miss()
        st.queue.remove(chosen)
        try:
            chosen._launch_verified(chosen_descs)
        except HorovodInternalError as exc:
            chosen.err = exc
            chosen._done()
    return chosen, chosen_descs


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
    for i, d in live[1:]:
        if d.device != first.device:
            return (f"Mismatched device types: One rank had a tensor on {first.device}, but another "
                    f"rank had a tensor on {d.device}.")
    if len(live) < len(descs) and first.kind not in _JOIN_KINDS:
        return f"{first.kind} is not supported while some ranks have called hvd.join()"
    return _KINDS[first.kind][0](descs, st)


# Collectives that may run while some ranks have joined (they contribute zeros).  As in Horovod,
# allgather / broadcast / alltoall / reducescatter with joined ranks fail on the other ranks.
_JOIN_KINDS = {"allreduce", "grouped_allreduce"}


_POLY_LIMIT = 256
_DEMOTE_AFTER = 8


def _note_streak(st: SetState, key: tuple, agr: Agreement) -> None:
    """A polymorphic key that hit the same agreement ``_DEMOTE_AFTER`` times in a row on the fast
    path becomes monomorphic again (speculative).  Every rank sees the same fast-path outcomes, so
    every rank demotes at the same op."""
    if key not in st.poly:
        return
    last, count = st.streak.get(key, (None, 0))
    count = count + 1 if last == agr.agid else 1
    if count >= _DEMOTE_AFTER:
        with st.lock:
            del st.poly[key]
            st.streak.pop(key, None)
            st.cache[key] = agr
            st.by_hash[agr.keyhash] = agr
    else:
        st.streak[key] = (agr.agid, count)


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
    if st.stale:
        speculative = False  # slots are being re-paired after a by-name match: no transfer may start early
    if st.unsettled.get(key):
        # An earlier op of this key, submitted here as a miss, is not processed yet: its verification
        # may change the key's agreement, so this rank's cache entry is not yet the one the other
        # ranks use for this op.  Claim nothing and launch nothing: the op is verified, and if
        # another rank launched speculatively, this rank joins with a dummy once it has caught up.
        hit = speculative = False
    p.agr = agr
    try:
        if st.n == 1:
            if not hit:
                p.agr = _remember(st, [desc])
            p.works = plan.launch(p.agr)
            p.stage = 1
            return p
        code = HIT if hit else 0
        spec = agr is not None and speculative
        if spec:
            code |= LAUNCHED
        kh = p.kh = _keyhash(key) if alts is None or not hit else agr.agid
        # the control word goes out BEFORE any data transfer (the shared-memory control relies on
        # it: a completed transfer proves every participant's control word is readable)
        p.tok = st.control.post(code, kh)
        st.queue.append(p)
        if not hit:
            st.unsettled[key] = st.unsettled.get(key, 0) + 1
            p.miss_key = key
        if spec:
            p.works = plan.launch(agr) if hit else _KINDS[desc.kind][1](agr, st)
            if hit and hooks.active:
                _emit_start(plan)
    except BaseException:
        inflight.pop(name, None)
        raise
    return p


def join(st: SetState) -> int:
    """This rank has no more data: serve the other ranks' collectives with zeros until every rank
    has joined.  Returns the global rank of the last rank to join."""
    name = "join"
    while st.queue:  # our own earlier async ops go first, in order
        p = st.queue[0]
        p._launch_blocking()
        if p.stage != 0 and st.queue and st.queue[0] is p:
            st.queue.popleft()
    st.inflight[name] = time.monotonic()
    code = JOINED | JUST_JOINED
    try:
        while True:
            tok = st.control.post(code, 0)
            st.stale.discard(tok)
            g = st.control.result(tok)
            code = JOINED
            if all(c & JOINED for c, _kh, _t in g):
                last = max(i for i, (c, _kh, _t) in enumerate(g) if c & JUST_JOINED)
                return st.ranks[last]
            _settle_speculation(st, g, None)
            descs, _queued = _exchange_descs(st, None)
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
        worst = 0.0  # age of the oldest op that some rank has really not submitted
        posted: Dict[int, List[str]] = {}
        for name, (age, st) in stalled.items():
            for r in st.ranks:
                if r == self.rank:
                    continue
                if r not in posted:
                    posted[r] = self._posted_names(r)
                if name not in posted[r]:
                    missing.setdefault(r, []).append(name)
                    worst = max(worst, age)
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
