"""Pieces shared by the two ``DistributedOptimizer`` flavours (gradient averaging in ``optimizer``,
Adasum deltas in ``_adasum``)."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional

import torch

__all__ = ["synchronize_skipped", "explicit_groups"]


@contextlib.contextmanager
def synchronize_skipped(optimizer: Any) -> Iterator[None]:
    """The body of ``skip_synchronize()``, shared by the plain and the Adasum optimizer."""
    optimizer._should_synchronize = False
    try:
        yield
    finally:
        optimizer._should_synchronize = True


def explicit_groups(groups: Any, params: List[torch.Tensor], index: Dict[int, int]) -> Optional[List[List[int]]]:
    """Validate Horovod's ``groups`` and turn it into lists of parameter indices."""
    if groups is None:
        return None
    if isinstance(groups, bool) or not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    if isinstance(groups, int):
        # Split the parameters, in gradient order (reversed), into `groups` near-equal groups.
        order = list(reversed(range(len(params))))
        n = min(groups, len(order)) or 1
        q, r = divmod(len(order), n)
        out, start = [], 0
        for k in range(n):
            end = start + q + (1 if k < r else 0)
            if end > start:
                out.append(order[start:end])
            start = end
        return out
    seen = set()
    out = []
    for sub in groups:
        if not isinstance(sub, (list, tuple)):
            raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
        members = []
        for p in sub:
            if not isinstance(p, torch.Tensor):
                raise ValueError("groups must consist of torch.Tensor.")
            if id(p) in seen:
                raise ValueError("A parameter can only appear once in groups.")
            seen.add(id(p))
            if not getattr(p, "requires_grad", False):
                continue
            if id(p) not in index:
                raise ValueError("groups contains a tensor that is not a parameter of the optimizer.")
            members.append(index[id(p)])
        if members:
            out.append(members)
    return out


