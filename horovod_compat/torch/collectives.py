"""``horovod.torch``'s collectives: the runtime's (``horovod_compat.common.collectives``) plus what
is torch's own -- the differentiable forms (``torch.autograd.Function``s whose backward is Horovod's
gradient of each op), compression on the wire, and sparse COO tensors.

``allreduce``/``grouped_allreduce``/``allgather``/``grouped_allgather``/``broadcast``/``alltoall``/
``reducescatter``/``grouped_reducescatter`` return new tensors and are differentiable; the async and
in-place forms come from the runtime unchanged.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch
import torch.distributed as dist

from horovod_compat.common.collectives import *  # noqa: F401,F403
from horovod_compat.common.collectives import __all__ as _common_all
from horovod_compat.common.collectives import (
    new_handle, resolve_op, set_state, submit_allgather, submit_allreduce, submit_alltoall,
    submit_broadcast, submit_reducescatter, synchronize,
)
from horovod_compat.common.ops import Average, Sum
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from .compression import Compression

__all__ = [n for n in _common_all if not n.startswith(("submit_", "set_state", "resolve_op",
                                                         "new_handle"))] + [
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
    "reducescatter", "grouped_reducescatter", "sparse_allreduce_async",
]


def _allreduce_nograd(tensor: torch.Tensor, name: Optional[str], op: int, prescale: float,
                      postscale: float, process_set: Optional[ProcessSet]) -> torch.Tensor:
    return submit_allreduce([tensor], None, name, op, prescale, postscale, process_set,
                             "allreduce").wait()


class _AllreduceFn(torch.autograd.Function):
    """Differentiable allreduce: the gradient is allreduced with the same op."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):  # type: ignore[override]
        ctx.args = (op, prescale, postscale, process_set)
        return _allreduce_nograd(tensor, name, op, prescale, postscale, process_set)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        op, prescale, postscale, process_set = ctx.args
        return (_allreduce_nograd(grad.contiguous(), None, op, prescale, postscale, process_set),
                None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks (default: Average) and return a new tensor.

    Differentiable; ``compression`` compresses for the wire (e.g. ``Compression.fp16``).
    """
    op = resolve_op(average, op)
    t, ctx = compression.compress(tensor) if compression is not Compression.none else (tensor, None)
    if t.requires_grad and torch.is_grad_enabled():
        out = _AllreduceFn.apply(t, name, op, prescale_factor, postscale_factor, process_set)
    else:
        out = _allreduce_nograd(t, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx) if compression is not Compression.none else out


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):  # type: ignore[override]
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(submit_allreduce(list(tensors), None, name, op, prescale, postscale,
                                       process_set, "grouped_allreduce").wait())

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        op, prescale, postscale, process_set = ctx.args
        out = submit_allreduce([g.contiguous() for g in grads], None, None, op, prescale,
                                postscale, process_set, "grouped_allreduce").wait()
        return (None, None, None, None, None, *out)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: Any = Compression.none,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Reduce a list of tensors as one op; returns new tensors (differentiable)."""
    op = resolve_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    ts = [p[0] for p in pairs]
    if any(t.requires_grad for t in ts) and torch.is_grad_enabled():
        outs = list(_GroupedAllreduceFn.apply(name, op, prescale_factor, postscale_factor,
                                              process_set, *ts))
    else:
        outs = submit_allreduce(ts, None, name, op, prescale_factor, postscale_factor,
                                 process_set, "grouped_allreduce").wait()
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


class _AllgatherFn(torch.autograd.Function):
    """Differentiable allgather, single or grouped (``kind``): each gradient is averaged over the
    set (one allreduce, grouped for the grouped op), then this rank's rows are kept."""

    @staticmethod
    def forward(ctx, kind, name, process_set, *tensors):  # type: ignore[override]
        p = submit_allgather(list(tensors), name, process_set, kind)
        out = p.wait()
        ctx.dims = [[d.shapes[i][0] if d is not None else 0 for d in p.agr.descs]
                    for i in range(len(tensors))]
        ctx.kind, ctx.process_set = kind, process_set
        return out if kind == "allgather" else tuple(out)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        me = set_state(ctx.process_set).me
        reduce_kind = "allreduce" if ctx.kind == "allgather" else "grouped_allreduce"
        reduced = submit_allreduce([g.contiguous() for g in grads], None, None, Average, 1.0, 1.0,
                                    ctx.process_set, reduce_kind).wait()
        if ctx.kind == "allgather":
            reduced = [reduced]
        rows = [r[sum(dims[:me]): sum(dims[:me + 1])] for r, dims in zip(reduced, ctx.dims)]
        return (None, None, None, *rows)


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (first dimensions may differ)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFn.apply("allgather", name, process_set, tensor)
    return submit_allgather([tensor], name, process_set, "allgather").wait()


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allgather a list of tensors as one op (differentiable)."""
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return list(_AllgatherFn.apply("grouped_allgather", name, process_set, *tensors))
    return submit_allgather(list(tensors), name, process_set, "grouped_allgather").wait()


class _BroadcastFn(torch.autograd.Function):
    """Differentiable broadcast: averaged gradient on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):  # type: ignore[override]
        ctx.root, ctx.process_set = root_rank, process_set
        return submit_broadcast(tensor, root_rank, name, process_set, False).wait()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        reduced = _allreduce_nograd(grad.contiguous(), None, Average, 1.0, 1.0, ctx.process_set)
        if dist.get_rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return global rank ``root_rank``'s ``tensor`` on every rank (differentiable)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFn.apply(tensor, root_rank, name, process_set)
    return submit_broadcast(tensor, root_rank, name, process_set, False).wait()


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):  # type: ignore[override]
        # the received splits are kept even for an even split: ranks' first dimensions may differ,
        # so the gradient must travel back along the rows each rank really received
        out, recv = submit_alltoall(tensor, splits, name, process_set, with_recv=True).wait()
        ctx.process_set = process_set
        ctx.recv = recv.tolist()
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx, grad, _):  # type: ignore[override]
        g, _r = submit_alltoall(grad.contiguous(), ctx.recv, None, ctx.process_set).wait()
        return g, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Scatter rows of ``tensor`` to every rank and gather theirs.

    Returns ``output``, or ``(output, received_splits)`` when ``splits`` is given.
    """
    if tensor.requires_grad and torch.is_grad_enabled():
        out, recv = _AlltoallFn.apply(tensor, splits, name, process_set)
        return out if splits is None else (out, recv)
    return submit_alltoall(tensor, splits, name, process_set).wait()


def _reducescatter_grads(grads: Sequence[torch.Tensor], op: int, prescale: float, postscale: float,
                         process_set: Optional[ProcessSet]) -> List[torch.Tensor]:
    """Horovod's reducescatter gradient: each rank's output gradient, times the set's size for
    Sum and times both scale factors, allgathered back to the input's shape."""
    factor = prescale * postscale * (set_state(process_set).n if op == Sum else 1)
    scaled = [(g * factor if factor != 1.0 else g).contiguous() for g in grads]
    return submit_allgather(scaled, None, process_set, "grouped_allgather").wait()


class _ReducescatterFn(torch.autograd.Function):
    """Differentiable reducescatter (gradient: see ``_reducescatter_grads``)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):  # type: ignore[override]
        ctx.args = (op, prescale, postscale, process_set)
        return submit_reducescatter([tensor], name, op, prescale, postscale, process_set,
                                     "reducescatter").wait()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return (_reducescatter_grads([grad], *ctx.args)[0], None, None, None, None, None)


class _GroupedReducescatterFn(torch.autograd.Function):
    """Differentiable grouped reducescatter (gradients: see ``_reducescatter_grads``)."""

    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):  # type: ignore[override]
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(submit_reducescatter(list(tensors), name, op, prescale, postscale,
                                           process_set, "grouped_reducescatter").wait())

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        return (None, None, None, None, None, *_reducescatter_grads(grads, *ctx.args))


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression: Any = Compression.none, op: int = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks and return this rank's block of rows (Sum or Average)."""
    t, ctx = compression.compress(tensor)
    if t.requires_grad and torch.is_grad_enabled():
        out = _ReducescatterFn.apply(t, name, op, prescale_factor, postscale_factor, process_set)
    else:
        out = submit_reducescatter([t], name, op, prescale_factor, postscale_factor, process_set,
                                    "reducescatter").wait()
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression: Any = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reducescatter a list of tensors as one op (differentiable)."""
    pairs = [compression.compress(t) for t in tensors]
    ts = [p[0] for p in pairs]
    if any(t.requires_grad for t in ts) and torch.is_grad_enabled():
        outs = list(_GroupedReducescatterFn.apply(name, op, prescale_factor, postscale_factor,
                                                  process_set, *ts))
    else:
        outs = submit_reducescatter(ts, name, op, prescale_factor, postscale_factor,
                                     process_set, "grouped_reducescatter").wait()
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


class SparseAllreduceHandle(int):
    """What ``sparse_allreduce_async`` returns: Horovod code calls it (``handle()``) to wait for the
    result; it is also a handle that ``poll`` and ``synchronize`` accept."""

    def __call__(self) -> torch.Tensor:
        return synchronize(self)


class _SparseAllreduce:
    """A sparse allreduce in flight: two allgathers (indices, values), combined when waited."""

    def __init__(self, tensor: torch.Tensor, name: Optional[str], op: int,
                 process_set: Optional[ProcessSet]) -> None:
        if op not in (Average, Sum):
            raise ValueError("sparse_allreduce_async supports only Average and Sum")
        self.t = tensor.coalesce()
        self.op = op
        self.n = set_state(process_set).n
        self.pi = submit_allgather([self.t.indices().t().contiguous()],
                                    f"{name}.indices" if name else None, process_set, "allgather")
        self.pv = submit_allgather([self.t.values().contiguous()],
                                    f"{name}.values" if name else None, process_set, "allgather")

    def poll(self) -> bool:
        return self.pi.poll() and self.pv.poll()

    def wait(self) -> torch.Tensor:
        idx, vals = self.pi.wait(), self.pv.wait()
        if self.op == Average:
            vals = vals / self.n if vals.is_floating_point() else vals.div(self.n, rounding_mode="trunc")
        return torch.sparse_coo_tensor(idx.t(), vals, self.t.shape)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: ProcessSet = global_process_set) -> SparseAllreduceHandle:
    """Reduce a sparse COO tensor by allgathering its indices and values; the handle's result is
    the (uncoalesced) sparse sum, divided by the set's size for Average."""
    return SparseAllreduceHandle(new_handle(_SparseAllreduce(tensor, name, op, process_set)))


def sparse_allreduce(tensor: torch.Tensor, op: int, process_set: Optional[ProcessSet]) -> torch.Tensor:
    """The same, waited for and coalesced (``DistributedOptimizer``'s sparse gradients)."""
    return _SparseAllreduce(tensor, None, op, process_set).wait().coalesce()

