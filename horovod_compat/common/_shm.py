"""Allreduce through shared memory for process sets whose ranks all run on one host, and for each
host's ranks of a set across hosts (the first and last steps of `_hierarchical`'s allreduce).

Why: on one host gloo still moves every byte through loopback TCP (a kernel copy on each side and
a syscall per segment), and Horovod's out-of-place ``hvd.allreduce`` needs one more full copy of the
input on top of that.  Reducing through a shared segment needs neither: on the 2-core dev box, 2
ranks, float32, a 64 MB out-of-place allreduce takes ~20 ms here against ~55 ms for gloo's
in-place ``dist.all_reduce``, 1 MB ~0.3 ms against ~0.5-1 ms (``benchmarks/collectives.py``).

The segment holds a header (one barrier counter per rank, each on its own cache line) and two
*banks* of one *slot* per rank.  A tensor is reduced in rounds of at most one slot; each round
splits its elements into one *part* per rank, and alternates the bank:

1. every rank copies the parts the other ranks own from its input into its own slot;
2. barrier;
3. rank j reduces part j -- its own input part and every peer's slot part -- straight into its
   output, then publishes that result in its own slot;
4. barrier;
5. every rank copies the other parts' results from their owners' slots into its output.

The input is only read (in-place ops pass the same tensor as input and output).  Two banks make
two barriers per round enough: a rank starts writing bank b again only after every rank has passed
step 4 of the following round, i.e. after everybody finished reading bank b.

Ordering: the set's coordinator (``negotiation``) runs each agreed reduction in the agreed order,
in the one thread that drives its rounds; the segment is released only after that thread stopped.

Failure: a rank waiting at a barrier checks every half second that its peers' processes are alive
and that the peers it waits for still beat (``liveness``: a frozen or stopped peer raises after
``HOROVOD_COMPAT_FROZEN_SECONDS``), and gives up after ``HOROVOD_COMPAT_OP_TIMEOUT`` seconds; each
raises ``HorovodInternalError`` and leaves the transport broken (later ops raise at once rather
than exchanging misaligned data).
``HOROVOD_COMPAT_SHM_DATA=0`` moves data through gloo instead; ``HOROVOD_COMPAT_SHM_SLOT_KB`` sets
the slot size (default 1024).  The memory ordering argument (data stores before the counter store)
is x86-64's total store order, the same as the shared-memory control words of ``negotiation``.
"""
from __future__ import annotations

import mmap
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist

from distributor import procfs

from . import liveness, ops, shm_names
from .exceptions import HorovodInternalError, peer_failure

__all__ = ["map_segment", "PeerWatch", "SharedMemoryAllreduce", "Transport", "create", "eligible",
           "data_enabled", "header_bytes", "slot_bytes"]

_COMBINE = ops.COMBINE  # Average arrives as a sum and is divided afterwards
#: dtypes reduced here (others -- bool, complex, int16 before its int32 widening -- use gloo).
DTYPES = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
                    torch.bfloat16, torch.float32, torch.float64})

_LINE = 64        # bytes per barrier counter (one cache line each: no false sharing); the
                  # line's second word says its rank left the transport (``abort``)
_ALIGN = 16       # part boundaries are multiples of 16 elements (whole vector lanes)


#: Whether this process has removed the segments of killed owners (`shm_names.remove_orphans`).
_swept = False


def map_segment(st: Any, size: int, owners: Optional[List[int]] = None) -> mmap.mmap:
    """Map a new ``size``-byte shared segment on every rank of set ``st`` (collective over its
    control group).  Rank ``i`` of the set maps the segment that rank ``owners[i]`` creates:
    without ``owners`` one segment, the set's first rank's; for a set across hosts, one per host
    (``_hierarchical``).  Each owner creates its segment with all pages reserved (so a full
    ``/dev/shm`` fails here with ``OSError``, on every rank, not later with SIGBUS) and unlinks it
    once everybody mapped it, or once the set failed (a peer died meanwhile), so nothing is left in
    ``/dev/shm`` unless the owner itself is killed between the two."""
    owners = owners if owners is not None else [0] * st.n
    created, error = None, None
    if owners[st.me] == st.me:
        global _swept
        if not _swept:  # what killed owners left on this host (shm_names)
            _swept = True
            shm_names.remove_orphans()
        created = shm_names.new_segment_path()
        try:
            fd = os.open(created, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError as exc:
            error = f"{created}: {exc}"
    made: List[Any] = [None] * st.n
    try:
        dist.all_gather_object(made, (created, error), group=st.ctl)
        errors = [e for _, e in made if e is not None]
        if errors:
            raise OSError(f"cannot create the shared-memory segment {errors[0]}")
        try:
            fd = os.open(made[owners[st.me]][0], os.O_RDWR)
            try:
                mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        finally:
            dist.barrier(group=st.ctl)
    finally:  # also when a peer died meanwhile: the gather or the barrier raised
        if created is not None:
            _unlink(created)
    return mm


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class PeerWatch:
    """Waits for peers through shared memory: spins briefly, then yields the CPU (2 ranks may
    share 2 cores), then sleeps; meanwhile checks every ~25 ms that the peers' processes still
    exist, and (``attach``) that the peers it waits for still show signs of life
    (``liveness.Watch``: a frozen or stopped peer raises), and gives up after
    ``HOROVOD_COMPAT_OP_TIMEOUT`` seconds -- a peer that died, froze or never comes raises
    ``HorovodInternalError`` instead of hanging this rank."""

    def __init__(self, pids: List[int], me: int) -> None:
        self.pids, self.me = pids, me
        self.timeout = float(os.environ.get("HOROVOD_COMPAT_OP_TIMEOUT", "1800"))
        self.liveness: Optional[liveness.Watch] = None
        self.index: Optional[List[int]] = None  # this watch's peer j is index[j] of the set
        self.pending: Optional[Callable[[], Iterable[int]]] = None

    def attach(self, watch: Optional[liveness.Watch], index: Optional[List[int]] = None,
               pending: Optional[Callable[[], Iterable[int]]] = None) -> None:
        """Check ``watch`` (the process set's beats) while waiting.  ``index`` maps this watch's
        peers to the set's indices (a host's part of a set); ``pending()``, when given, says
        which peers a wait that names none is waiting for (default: all)."""
        self.liveness, self.index, self.pending = watch, index, pending

    def _peer(self, j: int) -> Optional[int]:
        """Peer ``j``'s global rank, when known."""
        w = self.liveness
        if w is None:
            return None
        return w.ranks[self.index[j] if self.index is not None else j]

    def wait(self, ready: Callable[[], bool], what: str,
             pending: Optional[Callable[[], Iterable[int]]] = None) -> None:
        """Return once ``ready()`` is true; ``what`` names the awaited thing in errors;
        ``pending()`` lists the peers not arrived yet (for the liveness check)."""
        spins = 0
        deadline = next_check = None
        while not ready():
            spins += 1
            if spins <= 64:
                continue
            if spins < 2000:
                os.sched_yield()
                continue
            # Then sleeps: 50 us for about the first 10 ms, 1 ms for the next half second, 4 ms
            # after. A peer that is seconds late (a rank importing, compiling a graph,
            # checkpointing) then costs this rank about 1% of a core, not the 20% that 50 us
            # wake-ups cost, which the late peer itself may need.
            time.sleep(0.00005 if spins < 2200 else 0.001 if spins < 2700 else 0.004)
            now = time.monotonic()
            if next_check is None:
                deadline, next_check = now + self.timeout, now
            if now >= next_check:
                next_check = now + 0.025
                for j, pid in enumerate(self.pids):
                    # a peer may post what we wait for and then exit: look once more after its exit
                    if j != self.me and not procfs.alive(pid) and not ready():
                        raise peer_failure(
                            f"rank {j} of this process set (pid {pid}) exited while rank "
                            f"{self.me} waited for {what}", peer=self._peer(j))
                if now > deadline:
                    raise peer_failure(
                        f"{what}: a peer did not arrive within HOROVOD_COMPAT_OP_TIMEOUT="
                        f"{self.timeout:g} s", frozen=True)
                if self.liveness is not None:
                    self._check(pending or self.pending, what)

    def _check(self, pending: Optional[Callable[[], Iterable[int]]], what: str) -> None:
        peers = pending() if pending is not None else range(len(self.pids))
        if self.index is not None:
            peers = [self.index[j] for j in peers]
        assert self.liveness is not None
        self.liveness.check(peers, what)


class SharedMemoryAllreduce:
    """The reduction itself (see the module docstring); one per process set and rank."""

    def __init__(self, mm: mmap.mmap, n: int, me: int, pids: List[int], slot_bytes: int) -> None:
        self.mm, self.n, self.me = mm, n, me
        self.watch = PeerWatch(pids, me)
        self.slot_bytes = slot_bytes
        self.counters = memoryview(mm).cast("q")
        base = torch.frombuffer(mm, dtype=torch.uint8)
        head = header_bytes(n)
        self.slots = [[base[head + (b * n + j) * slot_bytes:head + (b * n + j + 1) * slot_bytes]
                       for j in range(n)] for b in range(2)]
        self.typed: Dict[tuple, List[torch.Tensor]] = {}
        self.epoch = 0
        self.rounds = 0
        self.broken: Optional[str] = None
        self.broken_error: Optional[BaseException] = None  # what broke it (its type travels on)

    def allreduce(self, src: torch.Tensor, dst: torch.Tensor, op: int,
                  across: Optional[Callable[[torch.Tensor], None]] = None) -> None:
        """``dst = op(src of every rank)``; both contiguous CPU tensors of one dtype and numel
        (``dst`` may be ``src``).  Blocks until this rank's output is complete.  ``across``,
        when given, is called on each part this rank reduced, in place, before the part is
        published: the host-aware allreduce reduces it across hosts there."""
        if self.broken is not None:
            raise liveness.same_kind(self.broken_error, self.broken)
        combine = _COMBINE[op]
        n, me = self.n, self.me
        sf, df = src.reshape(-1), dst.reshape(-1)
        total = sf.numel()
        cap = self.slot_bytes // src.element_size()
        for off in range(0, total, cap):
            length = min(cap, total - off)
            bound = [off + (length * j // n) // _ALIGN * _ALIGN for j in range(n)] + [off + length]
            views = self._views(self.rounds & 1, src.dtype)
            self.rounds += 1
            mine = views[me]
            lo, hi = bound[me], bound[me + 1]
            # 1. the parts the others own go into my slot
            if lo > off:
                mine[:lo - off].copy_(sf[off:lo])
            if hi < off + length:
                mine[hi - off:length].copy_(sf[hi:off + length])
            self._barrier()
            # 3. my part: my input + every peer's slot, into my output; then publish it
            if hi > lo:
                acc = df[lo:hi]
                first = True
                for j in range(n):
                    if j != me:
                        part = views[j][lo - off:hi - off]
                        if first:
                            combine(sf[lo:hi], part, out=acc)
                            first = False
                        else:
                            combine(acc, part, out=acc)
                if across is not None:
                    across(acc)
                mine[lo - off:hi - off].copy_(acc)
            self._barrier()
            # 5. the other parts' results
            for j in range(n):
                if j != me and bound[j + 1] > bound[j]:
                    df[bound[j]:bound[j + 1]].copy_(views[j][bound[j] - off:bound[j + 1] - off])

    def _views(self, bank: int, dtype: torch.dtype) -> List[torch.Tensor]:
        """The slots of ``bank`` seen as ``dtype`` tensors (cached: built once per dtype)."""
        key = (bank, dtype)
        v = self.typed.get(key)
        if v is None:
            v = self.typed[key] = [s.view(dtype) for s in self.slots[bank]]
        return v

    def abort(self) -> None:
        """This rank leaves the transport (it failed between two barriers, or its set is shutting
        down): every peer that waits, now or later, at a barrier this rank has not reached
        raises.  Its barrier counter stays as it is, so a peer still on its way out of a barrier
        this rank passed is not disturbed."""
        if self.broken is None:
            self.broken = "this rank left the shared-memory transport of its process set"
        try:
            self.counters[self.me * (_LINE // 8) + 1] = 1  # the "left" word beside the counter
        except (ValueError, IndexError):
            pass  # already closed

    def _barrier(self) -> None:
        """Wait until every rank reached this point (counters in the header)."""
        self.epoch += 1
        e = self.epoch
        c = self.counters
        step = _LINE // 8
        c[self.me * step] = e
        n = self.n

        def ready() -> bool:
            arrived = True
            for j in range(n):
                if c[j * step] >= e:
                    continue
                if c[j * step + 1]:  # left before it reached this barrier
                    raise peer_failure(f"rank {j} of this host's part of the process set left a "
                                       "shared-memory allreduce (it failed or shut down)",
                                       peer=self.watch._peer(j))
                arrived = False
            return arrived

        def pending() -> List[int]:
            return [j for j in range(n) if c[j * step] < e]

        try:
            self.watch.wait(ready, "the peers of a shared-memory allreduce", pending)
        except HorovodInternalError as exc:
            # the ranks' barrier counts no longer match: later transfers would mix up data
            self.broken = f"{exc} (the shared-memory transport of this process set is now unusable)"
            self.broken_error = exc
            raise liveness.same_kind(exc, self.broken) from None

    def close(self) -> None:
        self.slots = []
        self.typed = {}
        liveness.unmap(self.mm, self.counters)


def header_bytes(n: int) -> int:
    return (n * _LINE + 4095) // 4096 * 4096


class _Done:
    """A finished transfer, in the shape of a torch ``Work`` (the reduction ran synchronously)."""

    __slots__ = ()

    def is_completed(self) -> bool:
        return True

    def wait(self) -> bool:
        return True


_DONE = _Done()


class Transport:
    """What a process set holds: the reducer, driven by the set's coordinator (one thread at a
    time, in the agreed order)."""

    def __init__(self, reducer: SharedMemoryAllreduce) -> None:
        self.reducer = reducer

    def allreduce(self, pairs: List[tuple], op: int) -> _Done:
        """``dst = op(src over ranks)`` for every ``(src, dst)`` pair, now, in this thread."""
        for src, dst in pairs:
            self.reducer.allreduce(src, dst, op)
        return _DONE

    def close(self) -> None:
        self.reducer.close()


def eligible(dtype: torch.dtype, op: int) -> bool:
    """Whether a reduction of ``dtype`` with Horovod op ``op`` goes through shared memory."""
    return op in _COMBINE and dtype in DTYPES


def data_enabled() -> bool:
    """Whether this rank lets allreduce data move through shared memory
    (``HOROVOD_COMPAT_SHM_DATA=0``: not)."""
    return os.environ.get("HOROVOD_COMPAT_SHM_DATA", "1") != "0" and os.path.isdir("/dev/shm")


def slot_bytes() -> int:
    """This rank's wish for the slot size (``HOROVOD_COMPAT_SHM_SLOT_KB``, at least 64 KiB)."""
    return max(64, int(float(os.environ.get("HOROVOD_COMPAT_SHM_SLOT_KB", "1024")))) << 10


def create(st: Any) -> Optional[Transport]:
    """The shared-memory transport for set ``st`` whose ranks share this host (collective), or
    None when it is disabled or the segment cannot be made (then gloo carries the data)."""
    flags = [None] * st.n
    dist.all_gather_object(flags, (data_enabled(), slot_bytes()), group=st.ctl)
    if st.n < 2 or not all(f[0] for f in flags):
        return None
    slot = flags[0][1]  # the set's first rank decides: every rank must lay the segment out alike
    try:
        mm = map_segment(st, header_bytes(st.n) + 2 * st.n * slot)
    except OSError as exc:
        import warnings

        warnings.warn(f"horovod_compat: {exc}; allreduce data goes through gloo instead")
        return None
    reducer = SharedMemoryAllreduce(mm, st.n, st.me, st.pids, slot)
    reducer.watch.attach(getattr(st, "watch", None))
    return Transport(reducer)
