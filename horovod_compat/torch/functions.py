"""Horovod's helper functions: broadcast of parameters, optimizer state and arbitrary objects, and
allgather of objects.

They are what nearly every Horovod training script calls right after ``hvd.init()`` to make all ranks
start from rank 0's weights (``broadcast_parameters``, ``broadcast_optimizer_state``) and to share
small Python values (``broadcast_object``, ``allgather_object``, which every binding shares:
``horovod_compat.common.objects``).

Implementation notes (our own design, not Horovod's):
- tensors are broadcast fused: one flat buffer per dtype, so a model with hundreds of small tensors
  costs a handful of collectives, not hundreds;
- the timeline still shows one row per tensor, named as Horovod names them: ``broadcast_parameters``
  uses each tensor's name (``broadcast.fc1.weight``: the ``state_dict`` key or the
  ``named_parameters`` name; ``broadcast.noname.<i>`` for an unnamed tensor), and
  ``broadcast_optimizer_state`` Horovod's ``<state key>.<occurrence>`` (``broadcast.momentum_buffer.1``).
  The fused buffer's timeline events are relayed to those rows (``_trace_as_members``); the fused
  broadcasts themselves and the layout checks are named ``broadcast_parameters.*`` /
  ``broadcast_optimizer_state.*`` and marked internal (hidden by the timeline tools by default).
"""
from __future__ import annotations

import contextlib
import threading
import zlib
from collections import OrderedDict, defaultdict
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from horovod_compat.common import hooks, mismatch, runtime
from horovod_compat.common.exceptions import HorovodInternalError
from horovod_compat.common.objects import set_size, allgather_object, broadcast_object
from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.timeline.writer import mark_internal

from . import collectives

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]


@contextlib.contextmanager
def _trace_as_members(fused: str, members: Sequence[Tuple[str, torch.Tensor]]) -> Iterator[None]:
    """While the fused op named ``fused`` runs, relay its timeline events (negotiation with every
    rank's readiness, op, backend activity, end) to one row per member tensor ``(name, tensor)``,
    so the timeline reads as Horovod's one-op-per-tensor broadcast.  Only while a timeline records
    (``hooks.active``); the relay never touches the data path.  The fused op's own end may be
    reported by the coordinator's thread just after ``wait()`` returned: the members' end is then
    emitted on the way out."""
    if not hooks.active or not members:
        yield
        return
    lock = threading.Lock()
    ended = [False]

    def relay(event: str, name: str, info: Dict[str, Any]) -> None:
        if name != fused:
            return
        with lock:
            if ended[0]:
                return
            if event == hooks.OP_END:
                ended[0] = True
        for member, t in members:
            if event == hooks.OP_START:
                hooks.emit(event, member, **dict(info, dtype=str(t.dtype).replace("torch.", ""),
                                                 shape=tuple(t.shape)))
            else:
                hooks.emit(event, member, **info)

    hooks.subscribe(relay)
    try:
        yield
    finally:
        hooks.unsubscribe(relay)
        with lock:
            late, ended[0] = not ended[0], True
        if late and hooks.active:
            for member, _t in members:
                hooks.emit(hooks.OP_END, member)


def _broadcast_tensors_(tensors: Sequence[torch.Tensor], root_rank: int, process_set: ProcessSet,
                        tag: str = "broadcast_parameters",
                        names: Optional[Sequence[str]] = None) -> None:
    """Broadcast ``tensors`` in place from global rank ``root_rank``, fused into one buffer per dtype.

    All ranks must pass tensors of the same shapes and dtypes in the same order (as Horovod requires);
    otherwise every rank raises ``HorovodInternalError`` naming the first differing tensor, and
    nothing is broadcast.  The check costs one small allreduce of a layout digest.

    The collectives are named ``<tag>.layout`` and ``<tag>.fused<k>`` (identical on every rank) and
    marked internal for the timeline, where ``names`` (one per tensor, e.g. ``broadcast.fc1.weight``)
    are the rows shown instead (``_trace_as_members``).
    """
    if set_size(process_set) == 1:
        return
    by_dtype: "OrderedDict[Tuple[torch.dtype, torch.device], List[int]]" = OrderedDict()
    for j, t in enumerate(tensors):
        by_dtype.setdefault((t.dtype, t.device), []).append(j)
    # one small allreduce checks that every rank has the same layout (otherwise the fused
    # buffers would differ, or their number)
    layout = repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    digest = zlib.crc32(layout)
    both = collectives.allreduce(torch.tensor([digest, -digest], dtype=torch.int64),
                                 op=collectives.Max, name=mark_internal(f"{tag}.layout"),
                                 process_set=process_set)
    if int(both[0]) != -int(both[1]):
        _check_same_layout(tensors, root_rank, process_set, names)
    with torch.no_grad():
        for k, ((dtype, device), idx) in enumerate(by_dtype.items()):
            ts = [tensors[j] for j in idx]
            if dtype == torch.bool:
                flat = torch.cat([t.detach().reshape(-1).to(torch.uint8) for t in ts])
            else:
                flat = torch.cat([t.detach().reshape(-1) for t in ts])
            fused = mark_internal(f"{tag}.fused{k}")
            members = [(names[j], tensors[j]) for j in idx] if names is not None else []
            with _trace_as_members(fused, members):
                collectives.broadcast_(flat, root_rank, name=fused, process_set=process_set)
            offset = 0
            for t in ts:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t) if dtype != torch.bool
                        else flat[offset:offset + n].view(t.shape).to(torch.bool))
                offset += n


def _check_same_layout(tensors: Sequence[torch.Tensor], root_rank: int, process_set: ProcessSet,
                       names: Optional[Sequence[str]] = None) -> None:
    """Raise ``HorovodInternalError`` naming the ranks and the first tensor whose shape or dtype
    differs between ranks (collective: every rank calls it)."""
    layout = [(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in tensors]
    layouts = allgather_object(layout, process_set=process_set)
    if len({repr(lay) for lay in layouts}) == 1:
        return
    ranks = list(process_set.ranks)
    if len({len(lay) for lay in layouts}) > 1:
        detail = ", ".join(f"rank {r}: {len(lay)} tensors" for r, lay in zip(ranks, layouts))
        msg = f"Mismatched number of tensors to broadcast from rank {root_rank}: {detail}."
    else:
        j = next(k for k in range(len(layout)) if len({repr(lay[k]) for lay in layouts}) > 1)
        shapes = [str(list(lay[j][0])) for lay in layouts]
        dtypes = [lay[j][1] for lay in layouts]
        problem = (mismatch.shape("BROADCAST", shapes) if mismatch.differ(shapes)
                   else mismatch.dtype(dtypes))
        msg = problem.describe(f"Tensor {names[j]!r}" if names is not None else f"Tensor #{j}",
                               ranks)
    raise HorovodInternalError(msg)


def broadcast_parameters(params: Union[Mapping[str, torch.Tensor], List[Any]], root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite ``params`` on every rank with the values of ``root_rank`` (in place).

    ``params`` is a ``state_dict`` (broadcast in key order, like Horovod, so every rank agrees on the
    order), or a list of ``(name, tensor)`` pairs (``list(model.named_parameters())``) or of tensors.
    Anything else -- e.g. a bare generator -- is a ``ValueError``, as in Horovod.
    """
    runtime.current()
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    tensors = []
    names = []
    for j, (name, p) in enumerate(items):
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"invalid parameter {name!r} of type: {type(p)}")
        tensors.append(p.data if isinstance(p, torch.nn.Parameter) else p)
        # Horovod's row: the op, then the name it passed (the state_dict key / parameter name)
        names.append(f"broadcast.{name}" if name is not None else f"broadcast.noname.{j}")
    _broadcast_tensors_(tensors, root_rank, process_set, "broadcast_parameters", names)


def _is_distributed_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    return getattr(optimizer, "_hvd_base", None) is not None


def _materialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's lazily built state with one step on zero gradients.

    As in Horovod, the parameters that require grad are left with zero gradients (scripts and
    Horovod's own tests read ``p.grad`` afterwards).  Unlike Horovod, the parameter values are put
    back after the step, so it has no side effect on the weights (e.g. from weight decay).
    """
    saved = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                saved.append((p, p.detach().clone()))
                p.grad = torch.zeros_like(p)
    base = getattr(optimizer, "_hvd_base", None)
    if base is not None:
        # A DistributedOptimizer's step() would all-reduce every gradient; the state only needs a
        # local step (which every rank takes identically).
        base.step(optimizer)
    else:
        optimizer.step()
    with torch.no_grad():
        for p, value in saved:
            p.copy_(value)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Optional[torch.nn.Module] = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Make the optimizer's state (tensors and per-group scalar options) equal to ``root_rank``'s.

    A fresh optimizer has no state yet; it is first materialized (zero gradients + one step, whose
    effect on the weights is undone).  ``torch.optim.LBFGS`` keeps state that cannot be broadcast and
    is a ``ValueError``, as in Horovod.  ``model`` is accepted for Horovod compatibility.
    """
    runtime.current()
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _materialize_state(optimizer)

    # The structure (options, state keys, scalar values, tensor shapes) comes from the root as one
    # pickled skeleton; the tensors then travel fused and in place.  Ranks may start from different
    # structures (e.g. only the root has state): they end with the root's.
    params = [p for g in optimizer.param_groups for p in g["params"]]
    is_root = dist.get_rank() == root_rank
    skeleton = None
    if is_root:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        state = {}
        for i, p in enumerate(params):
            if p in optimizer.state:
                entry = {}
                for k, v in optimizer.state[p].items():
                    if isinstance(v, torch.Tensor):
                        entry[k] = ("tensor", tuple(v.shape), v.dtype)
                    else:
                        entry[k] = ("value", v)
                state[i] = entry
        skeleton = {"groups": groups, "state": state}
    skeleton = broadcast_object(skeleton, root_rank=root_rank,
                                name=_internal_object_name("broadcast_optimizer_state.skeleton"),
                                process_set=process_set)

    if len(skeleton["groups"]) != len(optimizer.param_groups):
        raise ValueError("optimizer has %d parameter groups on this rank but %d on rank %d"
                         % (len(optimizer.param_groups), len(skeleton["groups"]), root_rank))
    for group, options in zip(optimizer.param_groups, skeleton["groups"]):
        for k, v in options.items():
            group[k] = v
    tensors = []
    names = []
    occurrences: Dict[str, int] = defaultdict(int)
    for i, entry in sorted(skeleton["state"].items()):
        p = params[i]
        st = optimizer.state[p]
        for k, spec in entry.items():
            # Horovod's name for a state tensor: its key and how many times the key was seen
            occurrences[k] += 1
            if spec[0] == "value":
                st[k] = spec[1]
            else:
                names.append(f"broadcast.{k}.{occurrences[k]}")
                _, shape, dtype = spec
                t = st.get(k)
                if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
                    t = torch.zeros(shape, dtype=dtype, device=p.device)
                    st[k] = t
                tensors.append(t)
    _broadcast_tensors_(tensors, root_rank, process_set, "broadcast_optimizer_state", names)


def _internal_object_name(name: str) -> str:
    """``name`` for ``broadcast_object``, its two broadcasts (``<name>.sz``, ``<name>``) marked internal."""
    mark_internal(f"{name}.sz")
    return mark_internal(name)
