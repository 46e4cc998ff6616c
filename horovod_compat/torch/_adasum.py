"""``DistributedOptimizer(op=Adasum)``: Horovod's *delta optimizer*.

With Adasum, ranks do not average gradients; each rank applies its own optimizer step to a parameter
as soon as the parameter's gradient is ready (during backward), and the *weight deltas* are combined
with the Adasum rule, which adds orthogonal components and averages parallel ones:

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

applied per tensor, pairwise over a binary tree of ranks ((r0, r1), (r2, r3))...  As in Horovod on
CPU, the number of ranks must be a power of two.

The reduction here gathers every rank's delta (``all_gather``) and evaluates the tree locally, in the
same order on every rank, so all ranks get bit-identical results.  It moves ``size`` times the data of
a bandwidth-optimal Adasum, which is fine for the CPU jobs this targets.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any, Dict, List

import torch

from horovod_compat.common import ops
from horovod_compat.common.exceptions import (STEP_AFTER_SYNC as _STEP_AFTER_SYNC,
                                              TOO_MANY_BACKWARDS as _TOO_MANY_BACKWARDS,
                                              ZERO_GRAD_PENDING as _ZERO_GRAD_PENDING)
from horovod_compat.common.process_sets import require_member

from . import collectives
from ._optim_util import explicit_groups as _explicit_groups, synchronize_skipped as _synchronize_skipped


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Methods copied into the dynamic subclass for ``op=Adasum`` (see the module docstring)."""

    _hvd_base: type = torch.optim.Optimizer

    def __init__(self, params: Any, named_parameters: Any, compression: Any, backward_passes_per_step: int,
                 op: Any, gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool,
                 process_set: Any):
        self._hvd_base.__init__(self, params)
        validate_names(self.param_groups, named_parameters)
        params_list = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        _explicit_groups(groups, params_list, {id(p): i for i, p in enumerate(params_list)})  # validation only
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.process_set = process_set
        self._size = require_member(process_set).size()  # fails early for a non-member
        if self._size & (self._size - 1):
            raise ValueError(f"Adasum on CPU needs a power-of-two number of ranks, not {self._size}")
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._delay = {p: backward_passes_per_step for p in self._params}
        self._deltas: Dict[torch.Tensor, Any] = {}   # p -> (delta (compressed), ctx)
        self._start: Dict[torch.Tensor, torch.Tensor] = {}
        self._touched = False
        self._synchronized = False
        self._should_synchronize = True
        ref = weakref.ref(self)
        self._hvd_handles = []
        for p in self._params:
            def hook(param: torch.Tensor) -> None:
                opt = ref()
                if opt is not None:
                    opt._on_grad(param)
            self._hvd_handles.append(p.register_post_accumulate_grad_hook(hook))

    def __del__(self) -> None:
        for h in self.__dict__.get("_hvd_handles", []):
            h.remove()

    def _on_grad(self, p: torch.Tensor) -> None:
        if self._delay[p] <= 0:
            raise AssertionError(_TOO_MANY_BACKWARDS)
        self._touched = True
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._local_step(p)

    def _local_step(self, p: torch.Tensor) -> None:
        """Step the wrapped optimizer on ``p`` alone; keep its delta for the Adasum reduction."""
        start = self._start.get(p)
        if start is None:
            start = self._start[p] = torch.empty_like(p.detach())
        with torch.no_grad():
            start.copy_(p)
        stashed = [g["params"] for g in self.param_groups]
        try:
            for g in self.param_groups:
                g["params"] = [p] if any(p is q for q in g["params"]) else []
            self._hvd_base.step(self)
        finally:
            for g, ps in zip(self.param_groups, stashed):
                g["params"] = ps
        with torch.no_grad():
            delta = p.detach() - start
        self._deltas[p] = self._compression.compress(delta) if self._compression is not None else (delta, None)

    def synchronize(self) -> None:
        """Step the parameters that did not step yet, combine all deltas with Adasum, apply them."""
        for p in self._params:
            if p not in self._deltas:
                self._local_step(p)
        for p in self._params:  # fixed order on every rank
            delta, ctx = self._deltas[p]
            gathered = collectives.allgather(delta.detach().reshape(1, -1), process_set=self.process_set)
            combined = ops.adasum_tree(list(gathered.unbind(0))).view_as(delta)
            if self._compression is not None:
                combined = self._compression.decompress(combined, ctx)
            with torch.no_grad():
                p.copy_(self._start[p] + combined.to(p.dtype))
        self._deltas.clear()
        self._delay = {p: self.backward_passes_per_step for p in self._params}
        self._touched = False
        self._synchronized = True

    def skip_synchronize(self) -> "contextlib.AbstractContextManager[None]":
        """Inside this context ``step()`` does not synchronize."""
        return _synchronize_skipped(self)

    def step(self, closure: Any = None) -> Any:
        """The local steps happened during backward; ``step()`` only combines and applies deltas."""
        loss = closure() if closure is not None else None
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(_STEP_AFTER_SYNC)
            self.synchronize()
        self._synchronized = False
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero gradients; an ``AssertionError`` while deltas are pending."""
        if self.__dict__.get("_touched"):
            raise AssertionError(_ZERO_GRAD_PENDING)
        return self._hvd_base.zero_grad(self, set_to_none)


def validate_names(param_groups: List[Dict[str, Any]], named_parameters: Any) -> None:
    if named_parameters is None:
        return
    named = list(named_parameters)
    if any(not isinstance(p, tuple) for p in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [k for k, _ in named]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: %s"
                         % ", ".join(map(str, dups)))
    unnamed = {id(v) for g in param_groups for v in g["params"]} - {id(v) for _, v in named}
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were "
                         "not named. Python object ids: %s" % ", ".join(map(str, sorted(unnamed))))


_COPIED = {k: v for k, v in _DistributedAdasumOptimizer.__dict__.items() if k not in ("__dict__", "__weakref__")}


def make_adasum_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Any, compression: Any,
                          backward_passes_per_step: int, op: Any, gradient_predivide_factor: float,
                          groups: Any, sparse_as_dense: bool, process_set: Any) -> torch.optim.Optimizer:
    """Build the Adasum delta optimizer (dynamic subclass of the user's optimizer class)."""
    base = optimizer.__class__
    cls = type(base.__name__, (base,), dict(_COPIED, _hvd_base=base))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
