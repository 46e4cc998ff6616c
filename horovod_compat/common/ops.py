"""Horovod's reduce ops: the one place they are defined.

Plain ints, as in Horovod (``hvd.Average == 0``): ``Average, Sum, Adasum, Min, Max, Product``.
Everything that needs to know about an op asks here: its name, the ``torch.distributed`` reduction
that carries it (Average travels as a Sum and is divided afterwards), its identity element (what a
rank that contributes nothing sends), the elementwise combination the shared-memory transport
applies, and the Adasum rule.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Union

import torch
import torch.distributed as dist

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "NAMES", "by_name", "name_of",
           "TORCH_OPS", "COMBINE", "identity", "adasum_pair", "adasum_tree"]

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

NAMES: Dict[int, str] = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
                         Product: "Product"}
_BY_NAME = {v: k for k, v in NAMES.items()}

#: the torch.distributed reduction that moves each op (Adasum has none: it gathers)
TORCH_OPS: Dict[int, dist.ReduceOp] = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM,
                                       Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX,
                                       Product: dist.ReduceOp.PRODUCT}

#: elementwise ``out = f(a, b)`` for the ops a transport can apply itself (Average as a sum)
COMBINE: Dict[int, Callable[..., torch.Tensor]] = {Average: torch.add, Sum: torch.add,
                                                   Min: torch.minimum, Max: torch.maximum,
                                                   Product: torch.mul}


def by_name(name: str) -> int:
    """``"Average"`` -> ``Average`` (ValueError for an unknown name)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"Unknown reduce op {name!r}; use one of {', '.join(_BY_NAME)}") from None


def name_of(op: int) -> str:
    """``Average`` -> ``"Average"`` (ValueError for an unknown op)."""
    try:
        return NAMES[op]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown reduce op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or "
                         "Product") from None


def identity(op: int, dtype: torch.dtype) -> Union[int, float, bool]:
    """The element that leaves a reduction unchanged (what a dummy contribution holds)."""
    if op in (Min, Max):
        if dtype == torch.bool:
            return op == Min
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        return info.max if op == Min else info.min
    if op == Product:
        return 1
    return 0


def adasum_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two vectors: each scaled down by half its projection on the other, then added
    (orthogonal parts add up, parallel ones average).  Dot products in float64; a vector whose
    squared norm is below 1e-8 keeps coefficient 1 (nothing to project on)."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot = torch.dot(a64, b64)
    anorm, bnorm = torch.dot(a64, a64), torch.dot(b64, b64)
    acoeff = 1.0 - dot / anorm * 0.5 if anorm.item() >= 1e-8 else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm.item() >= 1e-8 else 1.0
    return (acoeff * a64 + bcoeff * b64).to(a.dtype).view_as(a)


def adasum_tree(parts: List[torch.Tensor]) -> torch.Tensor:
    """Adasum of every rank's vector along a binary tree (pairs 0-1, 2-3, then (0,1)-(2,3), ...),
    the order of Horovod's recursive halving, so every rank computes the same result."""
    parts = list(parts)
    while len(parts) > 1:
        nxt = [adasum_pair(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]
