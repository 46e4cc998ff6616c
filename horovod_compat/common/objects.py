"""Python objects across ranks, for every framework binding: ``broadcast_object`` and
``allgather_object`` (Horovod's), as cloudpickle bytes in runtime buffers.

Objects travel as the length first, then the bytes.  Every rank issues the same collectives in the
same order whatever object it passes, so -- unlike real Horovod -- ranks passing objects of
different types never hang.
"""
from __future__ import annotations

import io
from typing import Any, List, Optional

import cloudpickle
import torch
import torch.distributed as dist

from . import collectives, runtime
from .process_sets import ProcessSet, global_process_set

__all__ = ["broadcast_object", "allgather_object", "set_size"]


def set_size(process_set: ProcessSet) -> int:
    runtime.current()  # Horovod's ValueError before init
    n = process_set.size()
    if n is None:
        raise ValueError(f"{process_set} has not been registered (hvd.init / hvd.add_process_set)")
    return n


def _dumps(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _loads(t: torch.Tensor) -> Any:
    return cloudpickle.loads(t.numpy().tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank (serialized with cloudpickle).

    Non-root ranks may pass anything (typically None).  ``name`` names the two broadcasts (the
    length, then the bytes) as Horovod does; without it they pair by position.
    """
    if set_size(process_set) == 1:
        return obj
    is_root = dist.get_rank() == root_rank  # Horovod's root is a global rank
    payload = _dumps(obj) if is_root else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    collectives.broadcast_(length, root_rank, name=f"{name}.sz" if name else None,
                           process_set=process_set)
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    collectives.broadcast_(payload, root_rank, name=name, process_set=process_set)
    return obj if is_root else _loads(payload)


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Return the list of every rank's ``obj``, in rank order (serialized with cloudpickle).

    Objects may differ in type and size between ranks.
    """
    if set_size(process_set) == 1:
        return [obj]
    payload = _dumps(obj)
    sizes = collectives.submit_allgather([torch.tensor([payload.numel()], dtype=torch.int64)],
                                         f"{name}.sz" if name else None, process_set, "allgather").wait()
    data = collectives.submit_allgather([payload], name, process_set, "allgather").wait()
    return [_loads(part) for part in data.split(sizes.tolist())]

