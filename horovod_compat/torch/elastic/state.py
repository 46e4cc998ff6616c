"""Elastic state objects of ``horovod.torch`` (the base ``State`` and ``ObjectState`` are the
runtime's, ``horovod_compat.common.elastic``): what ``commit()`` saves, ``restore()`` brings back after a failed
collective, and ``sync()`` copies from rank 0 when a round starts (Horovod 0.28.1's API).

- ``State``: reset callbacks, host-change notices and ``check_host_updates`` (every rank takes rank
  0's view of the notices, so all of them raise ``HostsUpdatedInterrupt`` at the same commit).
- ``ObjectState``: plain picklable attributes (``state.epoch``), broadcast from rank 0.
- ``TorchState``: a model, an optimizer, ``ElasticSampler`` objects and plain attributes; each torch
  object through a handler from ``get_handler_registry()``.

Commits are cheap: the model's and the optimizer's tensors are copied into buffers allocated at the
first save and reused (no ``deepcopy`` per commit); ``restore()`` copies them back, so the live
objects never share memory with the saved state.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple, Type

import torch

from horovod_compat.common.elastic import ObjectState, State
from horovod_compat.common import lifecycle
from horovod_compat.common.lifecycle import rank

from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler

__all__ = ["State", "ObjectState", "TorchState", "StateHandler", "ModelStateHandler",
           "OptimizerStateHandler", "SamplerStateHandler", "get_handler_registry",
           "set_handler_registry"]


# ---- saved copies of tensors ----------------------------------------------------------------------
def _snapshot(value: Any, into: Any = None) -> Any:
    """A copy of ``value`` (nested dicts/lists/tuples of tensors and plain values) that reuses the
    tensors of ``into``, an earlier snapshot, wherever shapes, dtypes and devices still match."""
    if isinstance(value, torch.Tensor):
        v = value.detach()
        if (isinstance(into, torch.Tensor) and into.shape == v.shape and into.dtype == v.dtype
                and into.device == v.device):
            return into.copy_(v)
        return v.clone()
    if isinstance(value, dict):
        old = into if isinstance(into, dict) else {}
        return {k: _snapshot(v, old.get(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        old = into if isinstance(into, type(value)) and len(into) == len(value) else [None] * len(value)
        items = [_snapshot(v, o) for v, o in zip(value, old)]
        return items if isinstance(value, list) else type(value)(items)
    return copy.deepcopy(value)


def _fresh(saved: Any) -> Any:
    """A copy of a snapshot to load into a live object (which must not share the saved buffers)."""
    if isinstance(saved, torch.Tensor):
        return saved.clone()
    if isinstance(saved, dict):
        return {k: _fresh(v) for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        items = [_fresh(v) for v in saved]
        return items if isinstance(saved, list) else type(saved)(items)
    return copy.deepcopy(saved)


class StateHandler:
    """Saves, restores and syncs one object tracked by a ``TorchState``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """The world changed (after a reset, before the sync): nothing to do by default."""

    def set_value(self, value: Any) -> None:
        """The attribute was assigned a new object: track it, and save it now."""
        self.value = value
        self.save()


class _TensorStateHandler(StateHandler):
    """An object with ``state_dict()``/``load_state_dict()``: saved by copying its tensors into the
    buffers of the previous save."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved: Any = None
        self.save()

    def save(self) -> None:
        self._saved = _snapshot(self.value.state_dict(), self._saved)

    def restore(self) -> None:
        self.value.load_state_dict(_fresh(self._saved))


class ModelStateHandler(_TensorStateHandler):
    """A ``torch.nn.Module``: its parameters and buffers (``state_dict()``)."""

    def restore(self) -> None:
        live = self.value.state_dict()
        if live.keys() == self._saved.keys() and all(
                live[k].shape == v.shape for k, v in self._saved.items()):
            with torch.no_grad():  # in place: the optimizer keeps referring to the same tensors
                for k, v in self._saved.items():
                    live[k].copy_(v)
        else:
            super().restore()

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_TensorStateHandler):
    """A ``torch.optim.Optimizer`` (incl. ``hvd.DistributedOptimizer``): state and param groups."""

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    """An ``ElasticSampler``: its epoch and how many samples of the epoch are processed."""

    def __init__(self, sampler: ElasticSampler) -> None:
        super().__init__(sampler)
        self._saved: Dict[str, Any] = {}
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        # hvd.elastic.run restores also after a failed re-join, with no world to deal the epoch
        # over: the reset after the next join deals it
        self.value.take_progress(copy.deepcopy(self._saved))
        if lifecycle.is_initialized():
            self.value.reset()

    def sync(self) -> None:
        # rank 0's progress; loading it also repartitions the rest of the epoch over the new world
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    def reset(self) -> None:
        # deal the rest of the epoch over the new world even when no sync follows (hosts only
        # removed: Horovod 0.28.1 kept the old world's shards then)
        self.value.reset()


_handler_registry: List[Tuple[Type[Any], Type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> List[Tuple[Type[Any], Type[StateHandler]]]:
    """``[(type, handler class)]``: the first type an attribute is an instance of picks its handler."""
    return _handler_registry


def set_handler_registry(registry: List[Tuple[Type[Any], Type[StateHandler]]]) -> None:
    global _handler_registry
    _handler_registry = registry


def _handler_for(value: Any) -> Optional[StateHandler]:
    for kind, handler_cls in _handler_registry:
        if isinstance(value, kind):
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """The elastic state of a PyTorch job: ``TorchState(model, optimizer, epoch=0, sampler=s)``.

    Every keyword becomes an attribute; one with a handler (models, optimizers, ``ElasticSampler``,
    see ``get_handler_registry``) is saved/restored/synced by it, any other as a plain object.
    Assigning a new object to a handled attribute (``state.model = other``) tracks and saves it.
    """

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: Dict[str, StateHandler] = {}
        plain: Dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
