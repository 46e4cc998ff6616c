"""The runtime's collectives on torch.distributed buffers: Horovod's allreduce, allgather, broadcast,
alltoall and reducescatter, their async / in-place / grouped forms, barrier, join, poll and
synchronize -- everything that is the same for every framework binding.  The bindings add what is
theirs on top: ``horovod_compat.torch.collectives`` the differentiable (autograd) forms, sparse
tensors and compression; ``horovod_compat.tensorflow`` converts TensorFlow tensors to and from
these buffers (zero-copy through NumPy) and registers TensorFlow gradients.

Semantics follow Horovod 0.28.1 (see docs/horovod_torch_api.md): ``X`` returns a new tensor,
``X_`` works in place, ``X_async`` / ``X_async_`` return an int handle for ``poll`` / ``synchronize``;
reduce ops ``Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5``; integer Average truncates;
``allgather`` accepts different first dimensions; ``broadcast``'s root is a global rank even inside a
process set.  Every op goes through ``negotiation.submit`` (cross-rank checks, stall inspector,
``hooks`` for the timeline).

Gloo gaps are closed here: int16 is reduced as int32 and moved as bytes; Average is a Sum followed
by a (truncating, for integers) division; unequal ``all_gather`` pads to the largest first
dimension.  The per-call path is kept thin: one small control message that overlaps the transfer,
no extra copies for in-place ops, one output allocation for out-of-place ones.  When the ranks of a
set share a host, allreduce data moves through shared memory (``_shm``), which reduces straight
from the inputs into the outputs; which transport an op uses depends only on its agreed descriptor,
so every rank (and a rank joining with a dummy) picks the same.  A grouped allreduce moves the
tensors under 1 MB of each dtype in one fused transfer (Horovod's tensor fusion), larger ones alone.
"""
from __future__ import annotations

import itertools
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _shm, mismatch, ops, runtime
from . import negotiation as _neg
from .exceptions import HorovodInternalError
from .negotiation import Agreement, Desc, Plan, SetState
from .ops import Adasum, Average, Max, Min, Product, Sum
from .process_sets import ProcessSet, global_process_set

__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce_async", "allreduce_async_", "allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_allreduce_",
    "allgather_async", "grouped_allgather_async",
    "broadcast_async", "broadcast_async_", "broadcast_",
    "alltoall_async", "reducescatter_async", "grouped_reducescatter_async",
    "join", "barrier", "poll", "synchronize",
    # for the framework bindings: submit an op, get something to wait() on
    "submit_allreduce", "submit_allgather", "submit_broadcast", "submit_alltoall",
    "submit_reducescatter", "set_state", "resolve_op", "new_handle",
]

_OP_NAMES = ops.NAMES

_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _allreduce_opts(op: dist.ReduceOp) -> Any:
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


# Prebuilt options: the hot path calls ``ProcessGroup.allreduce`` directly (the documented
# ProcessGroup API that DDP comm hooks use), skipping ``dist.all_reduce``'s argument checks and
# logging decorators (~9 us per call).
_AR_OPTS = {op: _allreduce_opts(top) for op, top in ops.TORCH_OPS.items()}

_DTYPE_NAMES: Dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    n = _DTYPE_NAMES.get(dtype)
    if n is None:
        n = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return n


_DTYPES_BY_NAME = {n: getattr(torch, n) for n in (
    "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool",
    "complex64", "complex128")}

# gloo cannot reduce int16: reduce as int32 (wrap-around of sums/products is preserved mod 2**16).
_REDUCE_WIRE = {torch.int16: torch.int32}


def _move_view(t: torch.Tensor) -> torch.Tensor:
    """A flat view of a contiguous tensor in a dtype gloo can move (int16 travels as bytes)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:  # an empty view may carry stride 0, which .view(uint8) refuses
        flat = torch.empty(0, dtype=t.dtype, device=t.device)
    return flat.view(torch.uint8) if t.dtype == torch.int16 else flat


_identity = ops.identity


# ----------------------------------------------------------------------------- handles

_noname: Dict[str, Any] = {}


def _auto_name(kind: str) -> str:
    c = _noname.get(kind)
    if c is None:
        c = _noname[kind] = itertools.count()
    return f"{kind}.noname.{next(c)}"


class _Handle:
    """What ``X_async`` hands out: a negotiation ``Pending`` plus an optional post-processing step."""

    __slots__ = ("pending", "post")

    def __init__(self, pending: Any, post: Optional[Callable[[Any], Any]] = None) -> None:
        self.pending = pending
        self.post = post

    def poll(self) -> bool:
        return self.pending.poll()

    def wait(self) -> Any:
        out = self.pending.wait()
        return self.post(out) if self.post is not None else out


class _Empty:
    """A grouped op over an empty list: nothing to communicate, the result is ``[]``."""

    agr = None

    def poll(self) -> bool:
        return True

    def wait(self) -> list:
        return []


def new_handle(h: Any) -> int:
    pending = getattr(h, "pending", h)
    if isinstance(pending, _neg.Pending):
        pending.detach()  # nobody waits yet: the coordinator's thread drives it
    return runtime.current().handles.add(h)


def poll(handle: int) -> bool:
    """True when the async op behind ``handle`` has finished (``synchronize`` will not block)."""
    return runtime.current().handles.get(handle).poll()


def synchronize(handle: int) -> Any:
    """Wait for the async op behind ``handle``, release the handle and return its output.

    A failed op raises ``HorovodInternalError``.
    """
    return runtime.current().handles.pop(handle).wait()


# ----------------------------------------------------------------------------- helpers

def set_state(process_set: Optional[ProcessSet]) -> SetState:
    runtime.current()  # Horovod's ValueError before init
    ps = global_process_set if process_set is None else process_set
    st = ps.negotiation
    if st is None:
        if ps.process_set_id is None:
            raise ValueError(f"{ps} has not been registered (hvd.init / hvd.add_process_set)")
        raise ValueError(f"Rank {dist.get_rank()} is not part of {ps}")
    return st


def resolve_op(average: Optional[bool], op: Optional[int]) -> int:
    if average is not None:
        if op is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES:
        raise ValueError(f"Unknown reduce op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or Product")
    return op


def _desc_shape(t: torch.Tensor) -> Tuple[int, ...]:
    return tuple(t.shape)


def _dev(d: Desc) -> torch.device:
    """Where dummy contributions for descriptor ``d`` live (same backend as the real tensors)."""
    if d.device == "cpu":
        return _CPU
    return torch.device(d.device, torch.cuda.current_device()) if d.device == "cuda" else torch.device(d.device)


_CPU = torch.device("cpu")


# ----------------------------------------------------------------------------- allreduce

class _AllreducePlan(Plan):
    """One or more tensors reduced with the same op (``allreduce`` and ``grouped_allreduce``)."""

    __slots__ = ("srcs", "bufs", "outs", "op", "postscale", "st", "single", "fused",
                 "_gathered")

    def launch(self, agr: Agreement) -> List[Any]:
        if self.op == Adasum:
            return _adasum_launch(self, agr)
        pairs = []
        self.fused = []
        for group in _fusion_groups(self.desc):
            if len(group) == 1:
                pairs.append((self.srcs[group[0]], self.bufs[group[0]]))
            else:  # small tensors travel together in one buffer (unpacked in finish)
                fused = torch.cat([self.srcs[i].reshape(-1) for i in group])
                pairs.append((fused, fused))
                self.fused.append((group, fused))
        return _reduce_pairs(self.st, self.desc, pairs)

    def transport(self) -> Optional[str]:
        return _data_path(self.st, self.desc) if self.op != Adasum else None

    def finish(self, agr: Agreement) -> Any:
        n = self.st.n
        if self.op == Adasum:
            _adasum_finish(self)
        else:
            for group, fused in self.fused:
                parts = fused.split([self.bufs[i].numel() for i in group])
                for i, part in zip(group, parts):
                    self.bufs[i].copy_(part.view(self.bufs[i].shape))
        for b, o in zip(self.bufs, self.outs):
            if self.op == Average:
                if b.is_floating_point() or b.is_complex():
                    _scale_(b, self.postscale / n) if self.postscale != 1.0 else b.div_(n)
                else:
                    b.div_(n, rounding_mode="trunc")
                    if self.postscale != 1.0:
                        _scale_(b, self.postscale)
            elif self.postscale != 1.0:
                _scale_(b, self.postscale)
            if o is not b:
                o.copy_(b)
        return self.outs[0] if self.single else list(self.outs)


def _allreduce_dummy(agr: Agreement, st: SetState) -> List[Any]:
    d = agr.template(st.me)
    joined = agr.descs[st.me] is None
    dtypes = d.dtype.split(",")
    if d.op == Adasum:
        return [_gather(torch.zeros(st.n * _numel(s), dtype=_DTYPES_BY_NAME[dt], device=_dev(d)),
                        torch.zeros(_numel(s), dtype=_DTYPES_BY_NAME[dt], device=_dev(d)),
                        group=st.pg,
                        async_op=True) for s, dt in zip(d.shapes, dtypes)]
    bufs = []
    for group in _fusion_groups(d):  # the transfers the real tensors of this agreement make
        dtype = _DTYPES_BY_NAME[dtypes[group[0]]]
        dtype = _REDUCE_WIRE.get(dtype, dtype)
        fill = 0 if joined else _identity(d.op, dtype)
        bufs.append(torch.full((sum(_numel(d.shapes[i]) for i in group),), fill, dtype=dtype,
                               device=_dev(d)))
    return _reduce_pairs(st, d, [(b, b) for b in bufs])


def _reduce_pairs(st: SetState, d: Desc, pairs: List[Tuple[torch.Tensor, torch.Tensor]],
                  ) -> List[Any]:
    """Start ``dst = op(src over ranks)`` for every pair, on the transport descriptor ``d`` picks
    (the gloo path reduces ``dst`` in place: its pairs have ``src is dst``)."""
    path = _data_path(st, d)
    if path == "SHM":
        return [st.shm.allreduce(pairs, d.op)]
    if path == "HOSTS":
        return st.hosts.allreduce(pairs, d.op)
    if path == "TCP":
        return st.mesh.allreduce(pairs, d.op)
    opts = _AR_OPTS[d.op]
    return [st.pg.allreduce([dst], opts) for _src, dst in pairs]


#: Tensors of a grouped allreduce smaller than this share one transfer per dtype (Horovod's tensor
#: fusion: one 4 KB gloo allreduce costs about as much as one of 400 KB).
_FUSE_BELOW = 1 << 20


def _fusion_groups(d: Desc) -> List[List[int]]:
    """Which tensors of allreduce ``d`` travel together: per dtype, all those under
    ``_FUSE_BELOW`` bytes; every larger one alone.  A function of the agreed descriptor only, so a
    rank joining with dummies makes the same transfers."""
    if len(d.shapes) == 1:
        return [[0]]
    alone: List[List[int]] = []
    by_dtype: Dict[str, List[int]] = {}
    for i, (shape, dtn) in enumerate(zip(d.shapes, d.dtype.split(","))):
        dtype = _DTYPES_BY_NAME[dtn]
        size = _numel(shape) * _REDUCE_WIRE.get(dtype, dtype).itemsize
        if size >= _FUSE_BELOW:
            alone.append([i])
        else:
            by_dtype.setdefault(dtn, []).append(i)
    return alone + list(by_dtype.values())


_OURS_OK: Dict[Tuple[str, int], bool] = {}


def _data_path(st: SetState, d: Desc) -> Optional[str]:
    """What moves the data of allreduce ``d``: ``"SHM"`` (the set's shared memory, ``_shm``),
    ``"HOSTS"`` (each host's shared memory, then rings across the hosts, ``_hierarchical``),
    ``"TCP"`` (the set's TCP mesh, ``_mesh``) or None (the set's process group: gloo, or NCCL for
    CUDA tensors).  The timeline shows this name.

    Decided from the agreed descriptor alone, so every rank -- and a rank joining with a dummy --
    picks the same transport."""
    if d.device != "cpu" or (st.shm is None and st.mesh is None):
        return None
    key = (d.dtype, d.op)
    ok = _OURS_OK.get(key)
    if ok is None:
        wire = [_REDUCE_WIRE.get(_DTYPES_BY_NAME[n], _DTYPES_BY_NAME[n]) for n in d.dtype.split(",")]
        ok = _OURS_OK[key] = all(_shm.eligible(w, d.op) for w in wire)
    if not ok:
        return None
    if st.shm is not None:
        return "SHM"
    return "HOSTS" if st.hosts is not None else "TCP"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _per_rank(descs: Sequence[Optional[Desc]], value: Callable[[Desc], Any]) -> List[Any]:
    """``value(d)`` of every rank's descriptor (None for ranks that joined)."""
    return [value(d) if d is not None else None for d in descs]


def _texts(values: Sequence[Any]) -> List[Optional[str]]:
    """Every rank's value as the message shows it (None stays None: a rank that joined)."""
    return [str(v) if v is not None else None for v in values]


def _shapes_of(descs: Sequence[Optional[Desc]], j: int) -> List[Optional[str]]:
    return _per_rank(descs, lambda d: str(list(d.shapes[j])))


def _first_differing(descs: Sequence[Optional[Desc]], value: Callable[[Desc, int], Any],
                     n: int) -> Optional[int]:
    """The index of the first of ``n`` tensors whose ``value(d, j)`` the ranks disagree on."""
    return next((j for j in range(n) if mismatch.differ(_per_rank(descs, lambda d: value(d, j)))),
                None)


def _dtype_mismatch(descs: Sequence[Optional[Desc]], n: int) -> Optional[mismatch.Mismatch]:
    j = _first_differing(descs, lambda d, j: d.dtype.split(",")[j], n)
    if j is None:
        return None
    return mismatch.dtype(_per_rank(descs, lambda d: d.dtype.split(",")[j]), j)


def _count_mismatch(descs: Sequence[Optional[Desc]], kind: str) -> Optional[mismatch.Mismatch]:
    counts = _per_rank(descs, lambda d: len(d.shapes))
    if mismatch.differ(counts):
        return mismatch.count(kind, _texts(counts))
    return None


def _validate_same(descs: Sequence[Optional[Desc]], st: SetState) -> Optional[mismatch.Mismatch]:
    """Allreduce / reducescatter / broadcast: identical dtype, shapes, op and scaling everywhere."""
    live = [d for d in descs if d is not None]
    a = live[0]
    if all(d == a for d in live):  # the common case, one comparison per rank
        return None
    kind = a.kind.upper().replace("GROUPED_", "")
    err = _count_mismatch(descs, kind)
    if err is not None:
        return err
    ops_ = _per_rank(descs, lambda d: d.op)
    if mismatch.differ(ops_):
        return mismatch.reduce_op(kind, [_OP_NAMES.get(o) if o is not None else None
                                         for o in ops_])
    n = len(a.shapes)
    err = _dtype_mismatch(descs, n)
    if err is not None:
        return err
    j = _first_differing(descs, lambda d, j: d.shapes[j], n)
    if j is not None:
        return mismatch.shape(kind, _shapes_of(descs, j), j)
    if mismatch.differ(_per_rank(descs, lambda d: d.extra)):
        if a.kind == "broadcast":
            return mismatch.root_rank(_per_rank(descs, lambda d: str(d.extra[0])))
        return mismatch.scale(_per_rank(descs, lambda d: str(d.extra or (1.0, 1.0))))
    return None


_HUGE = 4 << 20
_libc: Any = None


class _OutputPool:
    """Recycles large output buffers of out-of-place collectives once the user dropped them.

    Why: a fresh 64 MB CPU tensor costs ~25 ms of page faults (every page is zeroed by the kernel on
    first touch) -- a third of a 2-rank gloo allreduce of that size.  Training loops call
    ``hvd.allreduce`` on same-sized tensors again and again and drop the previous result, so the
    pool keeps a reference to the storages it handed out and reuses one whose only remaining
    reference is the pool's own (torch's storage use count).  Bounded by
    ``HOROVOD_COMPAT_OUTPUT_POOL_MB`` (default 512; 0 disables).
    """

    def __init__(self) -> None:
        import os

        self.cap = int(float(os.environ.get("HOROVOD_COMPAT_OUTPUT_POOL_MB", "512")) * (1 << 20))
        self.storages: List[Any] = []
        self.use_count = getattr(torch._C, "_storage_Use_Count", None)
        if self.use_count is None:
            self.cap = 0

    def take(self, shape: Sequence[int], dtype: torch.dtype, nbytes: int) -> Optional[torch.Tensor]:
        for st in self.storages:
            if st.nbytes() == nbytes and self.use_count(st._cdata) == 1:
                return torch.empty(0, dtype=dtype).set_(st, 0, tuple(shape))
        return None

    def give(self, t: torch.Tensor) -> None:
        nbytes = t.untyped_storage().nbytes()
        if nbytes > self.cap:
            return
        total = sum(st.nbytes() for st in self.storages) + nbytes
        while total > self.cap and self.storages:
            # drop the oldest storage the user no longer holds (else the oldest at all)
            free = [i for i, st in enumerate(self.storages) if self.use_count(st._cdata) == 1]
            victim = self.storages.pop(free[0] if free else 0)
            total -= victim.nbytes()
        self.storages.append(t.untyped_storage())


_pool = _OutputPool()


def _new_buffer(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor like ``t``, new or recycled (see ``_OutputPool``).

    New large buffers get transparent huge pages (madvise), which halves their page-fault cost on
    Linux (29 -> 17 ms for 64 MB on the dev machine)."""
    nbytes = t.numel() * t.element_size()
    if nbytes < _HUGE or t.device.type != "cpu":
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out = _pool.take(t.shape, t.dtype, nbytes) if _pool.cap else None
    if out is None:
        out = torch.empty(t.shape, dtype=t.dtype)
        _advise_huge(out, nbytes)
        if _pool.cap:
            _pool.give(out)
    return out


def _fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` in a new (or recycled) buffer."""
    return _new_buffer(t).copy_(t)


def _advise_huge(out: torch.Tensor, nbytes: int) -> None:
    global _libc
    if _libc is False:
        return
    try:
        import ctypes

        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        p = out.data_ptr()
        start = (p + (1 << 21) - 1) & ~((1 << 21) - 1)
        length = (p + nbytes - start) & ~((1 << 21) - 1)
        if length > 0:
            _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), 14)  # MADV_HUGEPAGE
    except (OSError, AttributeError):
        _libc = False


def _prep_reduce(t: torch.Tensor, inplace: bool, prescale: float) -> torch.Tensor:
    """The buffer gloo reduces: the tensor itself when possible, else one contiguous copy."""
    wire = _REDUCE_WIRE.get(t.dtype, t.dtype)
    if inplace and wire is t.dtype and prescale == 1.0 and t.is_contiguous():
        return t
    t = t.detach()  # gradients, where wanted, come from the autograd functions below
    if wire is t.dtype:
        buf = _fresh_copy(t)
    else:
        buf = t.to(wire, memory_format=torch.contiguous_format)
    if prescale != 1.0:
        _scale_(buf, prescale)
    return buf


def _scale_(b: torch.Tensor, factor: float) -> None:
    """Multiply in place the way Horovod does: integers in float64 (then truncated), other floats
    in their own precision, except half precision on CPU, which is scaled in float32. On a GPU,
    Horovod's kernel first rounds the factor to the half type; the product of two half values is
    exact in float32, so torch's float32 arithmetic rounds it as the kernel's half multiply does."""
    if b.dtype in (torch.float32, torch.float64) or b.is_complex():
        b.mul_(factor)
    elif b.is_floating_point():
        if b.is_cuda:
            b.mul_(float(torch.tensor(factor, dtype=b.dtype)))
        else:
            b.copy_(b.float() * factor)
    else:
        b.copy_(b.double() * factor)


def _one_device(tensors: Sequence[torch.Tensor], kind: str) -> None:
    """Refuse a grouped op whose tensors are on different devices, before it is submitted.

    One op moves on one transport (gloo, NCCL or ours, chosen from its first tensor's device), so
    such an op cannot run; found only at launch, it would fail as a transfer does and break the
    process set for every later op. Horovod refuses it when it is enqueued (a ``RuntimeError``), and
    so does this: the user's mistake fails only its own op. Not ``HorovodInternalError``, which
    ``hvd.elastic.run`` answers with a reset."""
    first = tensors[0].device
    for t in tensors[1:]:
        if t.device != first:
            raise RuntimeError(f"{kind}: the tensors of one grouped operation must be on one device; "
                               f"got tensors on {first} and on {t.device}")


def submit_allreduce(tensors: Sequence[torch.Tensor], outs: Optional[Sequence[torch.Tensor]],
                      name: Optional[str], op: int, prescale: float, postscale: float,
                      process_set: Optional[ProcessSet], kind: str, traced: bool = True) -> Any:
    """Submit an allreduce of ``tensors`` (into ``outs`` in place, or into new tensors when None).
    ``traced=False``: no timeline events (the optimizer reports its buckets per parameter)."""
    st = set_state(process_set)
    if not tensors:
        return _Empty()
    if len(tensors) > 1:
        _one_device(tensors, kind)
    if op == Adasum and any(not (t.is_floating_point()) for t in tensors):
        raise ValueError("Adasum only supports floating-point tensors")
    inplace = outs is not None
    plan = _AllreducePlan()
    plan.st = st
    plan.op = op
    plan.postscale = float(postscale)
    plan.single = kind == "allreduce"
    extra = (float(prescale), float(postscale)) if (prescale != 1.0 or postscale != 1.0) else ()
    if len(tensors) == 1:  # the hot case: no generators
        t0 = tensors[0]
        plan.desc = Desc(kind, name or "", op, _dtype_name(t0.dtype), (tuple(t0.shape),), extra,
                         t0.device.type)
    else:
        plan.desc = Desc(kind, name or "", op, ",".join(_dtype_name(t.dtype) for t in tensors),
                         tuple(_desc_shape(t) for t in tensors), extra, tensors[0].device.type)
    if (not inplace and prescale == 1.0 and _data_path(st, plan.desc) is not None
            and all(t.is_contiguous() and t.dtype not in _REDUCE_WIRE for t in tensors)):
        # our transports reduce from the input into the output: no copy of the input here
        plan.srcs = list(tensors)
        plan.bufs = plan.outs = [_new_buffer(t) for t in tensors]
    else:
        plan.srcs = plan.bufs = [_prep_reduce(t, inplace, float(prescale)) for t in tensors]
        if inplace:
            plan.outs = list(outs)  # a converted buffer (int16, non-contiguous) is written back in finish()
        elif any(b.dtype != t.dtype for b, t in zip(plan.bufs, tensors)):
            plan.outs = [torch.empty_like(t) for t in tensors]
        else:
            plan.outs = plan.bufs
    plan.name = name or _auto_name(kind)
    return _neg.submit(st, plan, traced)


def reduce_in_place(tensors: Sequence[torch.Tensor], name: str, op: int,
                    process_set: Optional[ProcessSet]) -> Any:
    """``DistributedOptimizer``'s bucket reduction: ``tensors`` reduced in place with ``op`` as one
    op named ``name``, driven by the coordinator's thread while backward goes on.  The optimizer
    reports these to the timeline per parameter itself.  Returns something to ``wait()`` on, or
    None when there is nothing to reduce."""
    if not tensors:
        return None
    kind = "allreduce" if len(tensors) == 1 else "grouped_allreduce"
    return submit_allreduce(tensors, tensors, name, op, 1.0, 1.0, process_set, kind,
                             traced=False).detach(cycle=False)


def transport_name(tensor: torch.Tensor, op: int, process_set: Optional[ProcessSet]) -> Optional[str]:
    """The timeline's name for what moves an allreduce of ``tensor`` with ``op`` ("SHM", "HOSTS"
    or "TCP" when one of our transports does, ``_data_path``), None for the set's backend."""
    d = Desc("allreduce", "", op, _dtype_name(tensor.dtype), (tuple(tensor.shape),), (),
             tensor.device.type)
    return _data_path(set_state(process_set), d)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing ``tensor`` over all ranks into a new tensor; returns a handle."""
    op = resolve_op(average, op)
    return new_handle(submit_allreduce([tensor], None, name, op, prescale_factor,
                                         postscale_factor, process_set, "allreduce"))


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start reducing ``tensor`` in place; returns a handle (``synchronize`` returns ``tensor``)."""
    op = resolve_op(average, op)
    return new_handle(submit_allreduce([tensor], [tensor], name, op, prescale_factor,
                                         postscale_factor, process_set, "allreduce"))


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` in place over all ranks and return it."""
    op = resolve_op(average, op)
    return submit_allreduce([tensor], [tensor], name, op, prescale_factor, postscale_factor,
                             process_set, "allreduce").wait()


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors as one op; ``synchronize`` returns a list of new tensors."""
    op = resolve_op(average, op)
    return new_handle(submit_allreduce(list(tensors), None, name, op, prescale_factor,
                                         postscale_factor, process_set, "grouped_allreduce"))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors in place as one op; returns a handle."""
    op = resolve_op(average, op)
    tensors = list(tensors)
    return new_handle(submit_allreduce(tensors, tensors, name, op, prescale_factor,
                                         postscale_factor, process_set, "grouped_allreduce"))


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Reduce a list of tensors in place as one op and return them."""
    op = resolve_op(average, op)
    tensors = list(tensors)
    return submit_allreduce(tensors, tensors, name, op, prescale_factor, postscale_factor,
                             process_set, "grouped_allreduce").wait()


# ----------------------------------------------------------------------------- Adasum

def _adasum_launch(plan: _AllreducePlan, agr: Agreement) -> List[Any]:
    st = plan.st
    plan._gathered = []  # type: ignore[attr-defined]
    works = []
    for b in plan.bufs:
        g = torch.empty(st.n * b.numel(), dtype=b.dtype, device=b.device)
        plan._gathered.append(g)  # type: ignore[attr-defined]
        works.append(_gather(g, b.reshape(-1), group=st.pg, async_op=True))
    return works


def _adasum_finish(plan: _AllreducePlan) -> None:
    """Combine the gathered vectors with Adasum along a binary tree (rank pairs 0-1, 2-3, then
    (0,1)-(2,3) ...), the order of Horovod's recursive halving; every rank gets the same result."""
    n = plan.st.n
    for b, g in zip(plan.bufs, plan._gathered):  # type: ignore[attr-defined]
        b.copy_(ops.adasum_tree(list(g.view(n, -1).unbind(0))).view_as(b))
    # Adasum results are not averaged again
    plan.op = Sum


# ----------------------------------------------------------------------------- allgather

#: A grouped allgather whose tensors come to at most this many bytes on every rank moves as ONE
#: collective: each rank packs its tensors into one byte buffer, as Horovod's fusion buffer does
#: (a constant here, equal to Horovod's default HOROVOD_FUSION_THRESHOLD, which is not read). One
#: op instead of one per tensor: 5 small tensors took 3.9 ms apart, the time of one allgather
#: fused. Larger groups move tensor by tensor (no copy).
FUSED_ALLGATHER_BYTES = 64 << 20


class _AllgatherPlan(Plan):
    __slots__ = ("tensors", "st", "single", "outs", "parts")

    def launch(self, agr: Agreement) -> List[Any]:
        return _allgather_launch(self, agr, self.tensors)

    def finish(self, agr: Agreement) -> Any:
        if isinstance(self.parts, _Packed):
            res = self.parts.unpack()
        else:
            res = []
            for out, padded, dims, rest, dtype in self.parts:
                if padded:
                    n, m = len(dims), max(dims)
                    v = out.view(dtype).view((n, m) + rest) if dtype == torch.int16 else out.view((n, m) + rest)
                    res.append(torch.cat([v[j, :d] for j, d in enumerate(dims)]))
                else:
                    res.append(out.view(dtype).view((sum(dims),) + rest) if dtype == torch.int16
                               else out.view((sum(dims),) + rest))
        return res[0] if self.single else res


class _Packed:
    """A grouped allgather moved as one byte buffer per rank: rank j's tensor i is
    ``nbytes[j][i]`` bytes at ``offsets[j][i]`` of its ``width``-byte slot of ``out``."""

    __slots__ = ("out", "width", "offsets", "nbytes", "dims", "rests", "dtypes")

    def __init__(self, dims: List[List[int]], rests: List[Tuple[int, ...]],
                 dtypes: List[torch.dtype]) -> None:
        self.dims, self.rests, self.dtypes = dims, rests, dtypes
        ranks = len(dims[0])
        per_row = [math.prod(rest) * dt.itemsize for rest, dt in zip(rests, dtypes)]
        self.nbytes = [[dims[i][j] * per_row[i] for i in range(len(dims))] for j in range(ranks)]
        self.offsets = [list(itertools.accumulate(row[:-1], initial=0)) for row in self.nbytes]
        self.width = max(sum(row) for row in self.nbytes)

    def pack(self, me: int, tensors: Optional[Sequence[torch.Tensor]], device: torch.device) -> torch.Tensor:
        buf = torch.zeros(self.width, dtype=torch.uint8, device=device)
        for t, off, nb in zip(tensors or (), self.offsets[me], self.nbytes[me]):
            if nb:
                buf[off:off + nb].copy_(t.contiguous().reshape(-1).view(torch.uint8))
        return buf

    def unpack(self) -> List[torch.Tensor]:
        res = []
        for i, (rest, dtype) in enumerate(zip(self.rests, self.dtypes)):
            pieces = [self.out[j * self.width + off[i]: j * self.width + off[i] + nb[i]]
                      for j, (off, nb) in enumerate(zip(self.offsets, self.nbytes))]
            res.append(torch.cat(pieces).view(dtype).view((sum(self.dims[i]),) + rest))
        return res


def _allgather_launch(plan: Optional[_AllgatherPlan], agr: Agreement,
                      tensors: Optional[Sequence[torch.Tensor]], st: Optional[SetState] = None) -> List[Any]:
    st = st or plan.st
    tmpl = agr.template(st.me)
    dtypes = [_DTYPES_BY_NAME[n] for n in tmpl.dtype.split(",")]
    rests = [tuple(shape[1:]) for shape in tmpl.shapes]
    dims = [[d.shapes[i][0] if d is not None else 0 for d in agr.descs] for i in range(len(dtypes))]
    if len(dtypes) > 1:
        packed = _Packed(dims, rests, dtypes)
        if packed.width <= FUSED_ALLGATHER_BYTES:
            buf = packed.pack(st.me, tensors, _dev(tmpl))
            packed.out = torch.empty(len(agr.descs) * packed.width, dtype=torch.uint8, device=buf.device)
            if plan is not None:
                plan.parts = packed
            return [_gather(packed.out, buf, group=st.pg, async_op=True)]
    works, parts = [], []
    for i, (rest, dtype) in enumerate(zip(rests, dtypes)):
        m = max(dims[i])
        padded = min(dims[i]) != m
        if tensors is not None:
            t = tensors[i].contiguous()
        else:
            mine = agr.descs[st.me]
            t = torch.zeros((mine.shapes[i][0] if mine is not None else 0,) + rest, dtype=dtype,
                            device=_dev(tmpl))
        if padded and t.shape[0] != m:
            p = torch.zeros((m,) + rest, dtype=dtype, device=t.device)
            p[: t.shape[0]] = t
            t = p
        inp = _move_view(t)
        out = torch.empty(len(dims[i]) * inp.numel(), dtype=inp.dtype, device=inp.device)
        works.append(_gather(out, inp, group=st.pg, async_op=True))
        parts.append((out, padded, dims[i], rest, dtype))
    if plan is not None:
        plan.parts = parts
    return works


def _validate_allgather(descs: Sequence[Optional[Desc]], st: SetState,
                        ) -> Optional[mismatch.Mismatch]:
    live = [d for d in descs if d is not None]
    a = live[0]
    if all(d == a for d in live):
        return None
    err = _count_mismatch(descs, "ALLGATHER")
    if err is not None:
        return err
    n = len(a.shapes)
    err = _dtype_mismatch(descs, n)
    if err is not None:
        return err
    for j in range(n):
        ndims = _per_rank(descs, lambda d: len(d.shapes[j]))
        if mismatch.differ(ndims):
            return mismatch.gather_rank(_texts(ndims), _shapes_of(descs, j), j)
        for k in range(1, len(a.shapes[j])):
            dims = _per_rank(descs, lambda d: d.shapes[j][k])
            if mismatch.differ(dims):
                return mismatch.gather_dim(k, _texts(dims), _shapes_of(descs, j), j)
    return None


def submit_allgather(tensors: Sequence[torch.Tensor], name: Optional[str],
                      process_set: Optional[ProcessSet], kind: str) -> Any:
    st = set_state(process_set)
    if not tensors:
        return _Empty()
    if len(tensors) > 1:
        _one_device(tensors, kind)
    plan = _AllgatherPlan()
    plan.st = st
    plan.single = kind == "allgather"
    plan.tensors = [(t if t.dim() > 0 else t.reshape(1)).detach() for t in tensors]
    plan.desc = Desc(kind, name or "", -1, ",".join(_dtype_name(t.dtype) for t in plan.tensors),
                     tuple(_desc_shape(t) for t in plan.tensors), (), plan.tensors[0].device.type)
    plan.name = name or _auto_name(kind)
    return _neg.submit(st, plan)


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dim 0; returns a handle."""
    return new_handle(submit_allgather([tensor], name, process_set, "allgather"))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start allgathering a list of tensors as one op; returns a handle."""
    return new_handle(submit_allgather(list(tensors), name, process_set, "grouped_allgather"))


# ----------------------------------------------------------------------------- broadcast

class _BroadcastPlan(Plan):
    __slots__ = ("buf", "out", "root", "st")

    def launch(self, agr: Agreement) -> List[Any]:
        return [dist.broadcast(_move_view(self.buf), src=self.root, group=self.st.pg, async_op=True)]

    def finish(self, agr: Agreement) -> Any:
        if self.out is not self.buf:
            self.out.copy_(self.buf)
        return self.out


def _broadcast_dummy(agr: Agreement, st: SetState) -> List[Any]:
    d = agr.template(st.me)
    buf = torch.zeros(d.shapes[0], dtype=_DTYPES_BY_NAME[d.dtype], device=_dev(d))
    return [dist.broadcast(_move_view(buf), src=d.extra[0], group=st.pg, async_op=True)]


def submit_broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str],
                      process_set: Optional[ProcessSet], inplace: bool) -> Any:
    st = set_state(process_set)
    root_rank = int(root_rank)
    if root_rank not in st.ranks:
        raise ValueError(f"broadcast root rank {root_rank} is not part of process set with ranks "
                         f"{st.ranks}")
    plan = _BroadcastPlan()
    plan.st = st
    plan.root = root_rank
    if inplace:
        plan.out = tensor
        plan.buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    else:
        plan.buf = plan.out = tensor.clone(memory_format=torch.contiguous_format)
    plan.desc = Desc("broadcast", name or "", -1, _dtype_name(tensor.dtype),
                     (_desc_shape(tensor),), (root_rank,), tensor.device.type)
    plan.name = name or _auto_name("broadcast")
    return _neg.submit(st, plan)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start broadcasting ``tensor`` from global rank ``root_rank`` into a new tensor."""
    return new_handle(submit_broadcast(tensor, root_rank, name, process_set, False))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start broadcasting in place from global rank ``root_rank``; returns a handle."""
    return new_handle(submit_broadcast(tensor, root_rank, name, process_set, True))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with global rank ``root_rank``'s value and return it."""
    return submit_broadcast(tensor, root_rank, name, process_set, True).wait()


# ----------------------------------------------------------------------------- alltoall

class _AlltoallPlan(Plan):
    __slots__ = ("tensor", "st", "with_splits", "splits_device", "out", "recv")

    def launch(self, agr: Agreement) -> List[Any]:
        works, self.out, self.recv = _alltoall_launch(agr, self.st, self.tensor)
        return works

    def finish(self, agr: Agreement) -> Any:
        out = self.out.view(torch.int16) if self.tensor.dtype == torch.int16 else self.out
        out = out.view((sum(self.recv),) + tuple(self.tensor.shape[1:]))
        if self.with_splits:
            # on the device of the splits tensor given (Horovod: ``splits.new()``), else the CPU
            return out, torch.tensor(self.recv, dtype=torch.int32, device=self.splits_device)
        return out


def _alltoall_launch(agr: Agreement, st: SetState, tensor: Optional[torch.Tensor]):
    tmpl = agr.template(st.me)
    dtype = _DTYPES_BY_NAME[tmpl.dtype]
    rest = tuple(tmpl.shapes[0][1:])
    row = _numel(rest) * (2 if dtype == torch.int16 else 1)
    if tensor is None:
        tensor = torch.zeros(tmpl.shapes[0], dtype=dtype, device=_dev(tmpl))
    send = list(tmpl.extra[0])
    recv = [d.extra[0][st.me] for d in agr.descs]
    inp = _move_view(tensor.contiguous())
    out = torch.empty(sum(recv) * row, dtype=inp.dtype, device=inp.device)
    w = dist.all_to_all_single(out, inp, [r * row for r in recv], [s * row for s in send],
                               group=st.pg, async_op=True)
    return [w], out, recv


def _validate_alltoall(descs: Sequence[Optional[Desc]], st: SetState,
                       ) -> Optional[mismatch.Mismatch]:
    err = _dtype_mismatch(descs, 1)
    if err is not None:
        return err
    if mismatch.differ(_per_rank(descs, lambda d: d.shapes[0][1:])):
        # the first dimension may differ (the splits say how it is divided), no other
        return mismatch.shape("ALLTOALL", _shapes_of(descs, 0))
    return None


def submit_alltoall(tensor: torch.Tensor, splits: Any, name: Optional[str],
                     process_set: Optional[ProcessSet], with_recv: bool = False) -> Any:
    """Submit an alltoall; its result is ``(output, received_splits)`` when ``splits`` is given or
    ``with_recv`` is set, else ``output``."""
    st = set_state(process_set)
    if tensor.dim() == 0:
        raise ValueError("alltoall: the tensor must have at least one dimension")
    d0 = tensor.shape[0]
    splits_device = torch.device("cpu")
    if splits is None:
        if d0 % st.n:
            raise ValueError(f"alltoall: without splits, the first dimension ({d0}) must be a "
                             f"multiple of the number of ranks ({st.n})")
        sp = (d0 // st.n,) * st.n
    else:
        if isinstance(splits, torch.Tensor):
            splits_device = splits.device
            if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
                raise ValueError(f"alltoall: splits must contain integers (torch.int32), not "
                                 f"{splits.dtype}")
            splits = splits.tolist()
        sp = tuple(int(s) for s in splits)
        if len(sp) != st.n:
            raise ValueError(f"alltoall: splits has {len(sp)} entries, expected one per rank ({st.n})")
        if any(s < 0 for s in sp) or sum(sp) != d0:
            raise ValueError(f"alltoall: splits {list(sp)} must be non-negative and sum to the "
                             f"first dimension ({d0})")
    plan = _AlltoallPlan()
    plan.st, plan.tensor, plan.with_splits = st, tensor, splits is not None or with_recv
    plan.splits_device = splits_device
    plan.desc = Desc("alltoall", name or "", -1, _dtype_name(tensor.dtype), (_desc_shape(tensor),),
                     (sp,), tensor.device.type)
    plan.name = name or _auto_name("alltoall")
    return _neg.submit(st, plan)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall: rows ``splits[i]`` of ``tensor`` go to rank i; returns a handle whose
    ``synchronize`` gives ``(output, received_splits)``, as in Horovod."""
    return new_handle(submit_alltoall(tensor, splits, name, process_set, with_recv=True))


# ----------------------------------------------------------------------------- reducescatter

class _ReducescatterPlan(Plan):
    __slots__ = ("bufs", "op", "postscale", "st", "single")

    def launch(self, agr: Agreement) -> List[Any]:
        return [dist.all_reduce(b, op=dist.ReduceOp.SUM, group=self.st.pg, async_op=True)
                for b in self.bufs]

    def finish(self, agr: Agreement) -> Any:
        n, me = self.st.n, self.st.me
        outs = []
        for b, dtn in zip(self.bufs, self.desc.dtype.split(",")):
            base, extra = divmod(b.shape[0], n)
            start = me * base + min(me, extra)
            part = b[start: start + base + (1 if me < extra else 0)].clone()
            if self.op == Average and part.is_floating_point():
                _scale_(part, self.postscale / n)
            else:
                if self.op == Average:
                    part.div_(n, rounding_mode="trunc")
                if self.postscale != 1.0:
                    _scale_(part, self.postscale)
            dtype = _DTYPES_BY_NAME[dtn]
            outs.append(part if part.dtype == dtype else part.to(dtype))
        return outs[0] if self.single else outs


def _reducescatter_dummy(agr: Agreement, st: SetState) -> List[Any]:
    d = agr.template(st.me)
    works = []
    for s, dtn in zip(d.shapes, d.dtype.split(",")):
        dtype = _DTYPES_BY_NAME[dtn]
        works.append(dist.all_reduce(torch.zeros(s, dtype=_REDUCE_WIRE.get(dtype, dtype),
                                                 device=_dev(d)),
                                     group=st.pg, async_op=True))
    return works


def submit_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str], op: int,
                          prescale: float, postscale: float, process_set: Optional[ProcessSet],
                          kind: str) -> Any:
    st = set_state(process_set)
    if not tensors:
        return _Empty()
    if op not in (Average, Sum):
        # Horovod's core rejects the op when enqueueing it, which its Python layer re-raises as
        # HorovodInternalError (a RuntimeError)
        raise HorovodInternalError(f"Reducescatter only supports Average and Sum; use op=hvd.Sum or "
                                   f"op=hvd.Average (got {_OP_NAMES.get(op, op)}).")
    if len(tensors) > 1:
        _one_device(tensors, kind)
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("reducescatter does not support scalar tensors: the tensor must have "
                             "at least one dimension")
    plan = _ReducescatterPlan()
    plan.st, plan.op, plan.postscale = st, op, float(postscale)
    plan.single = kind == "reducescatter"
    plan.bufs = [_prep_reduce(t, False, float(prescale)) for t in tensors]
    extra = (float(prescale), float(postscale)) if (prescale != 1.0 or postscale != 1.0) else ()
    plan.desc = Desc(kind, name or "", op, ",".join(_dtype_name(t.dtype) for t in tensors),
                     tuple(_desc_shape(t) for t in tensors), extra, tensors[0].device.type)
    plan.name = name or _auto_name(kind)
    return _neg.submit(st, plan)


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter; returns a handle."""
    return new_handle(submit_reducescatter([tensor], name, op, prescale_factor, postscale_factor,
                                             process_set, "reducescatter"))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                                op: int = Average, process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start a grouped reducescatter; returns a handle."""
    return new_handle(submit_reducescatter(list(tensors), name, op, prescale_factor,
                                             postscale_factor, process_set,
                                             "grouped_reducescatter"))


# ----------------------------------------------------------------------------- barrier / join

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the process set reached the barrier."""
    set_state(process_set).barrier()


def join(device: int = -1) -> int:
    """Declare this rank out of data: until every rank joined, contribute zeros to the other
    ranks' collectives (Average still divides by the full size).  Returns the last rank to join."""
    return _neg.join(set_state(global_process_set))


# ----------------------------------------------------------------------------- registration

_neg.register_kind("allreduce", _validate_same, _allreduce_dummy)
_neg.register_kind("grouped_allreduce", _validate_same, _allreduce_dummy)
_neg.register_kind("allgather", _validate_allgather,
                   lambda agr, st: _allgather_launch(None, agr, None, st))
_neg.register_kind("grouped_allgather", _validate_allgather,
                   lambda agr, st: _allgather_launch(None, agr, None, st))
_neg.register_kind("broadcast", _validate_same, _broadcast_dummy)
_neg.register_kind("alltoall", _validate_alltoall, lambda agr, st: _alltoall_launch(agr, st, None)[0])
_neg.register_kind("reducescatter", _validate_same, _reducescatter_dummy)
_neg.register_kind("grouped_reducescatter", _validate_same, _reducescatter_dummy)
