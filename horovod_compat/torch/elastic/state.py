"""Elastic state objects: what ``commit()`` saves, ``restore()`` brings back after a failed
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
import queue
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import torch

from distributor import worker
from distributor.elastic.world import HostUpdate

from ..exceptions import HostsUpdatedInterrupt
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from ..lifecycle import rank
from .sampler import ElasticSampler

__all__ = ["State", "ObjectState", "TorchState", "StateHandler", "ModelStateHandler",
           "OptimizerStateHandler", "SamplerStateHandler", "get_handler_registry",
           "set_handler_registry"]


class State:
    """Base of elastic states (Horovod's ``horovod.common.elastic.State``).

    ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank; ``get_rank()`` this rank.
    """

    def __init__(self, bcast_object: Callable[[Any], Any] = broadcast_object,
                 get_rank: Callable[[], int] = rank) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: "queue.Queue[Tuple[float, HostUpdate]]" = queue.Queue()
        self._last_updated_timestamp: float = 0
        self._reset_callbacks: List[Callable[[], None]] = []
        #: commits made so far (``hvd.elastic.run`` tells progress from a failure loop by it)
        self.commits = 0

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called (in order) after every reset, e.g. to rescale the learning rate to the
        new number of workers."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After a reset (new world): forget the host notices about earlier rounds, ``reset()``,
        run the callbacks.

        A notice is about an earlier round when the driver stamped it before the new round
        formed (``worker.round_formed_at()``, same clock). One stamped later stays: it can reach
        this rank between the round's forming and this call (a replacement that joined at once),
        and dropping it would leave the newcomer waiting while this round trains without it."""
        self._last_updated_timestamp = max(self._last_updated_timestamp, worker.round_formed_at())
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: Any = HostUpdate.NO_UPDATE) -> None:
        """The driver announced a host change (called from the link's thread)."""
        self._host_messages.put((timestamp, HostUpdate(int(update_res))))

    def commit(self) -> None:
        """Save the state (the point a failure rolls back to), then ``check_host_updates()``."""
        self.save()
        self.commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank at once if hosts changed.

        Each rank folds the notices it received since the last check; rank 0's view (previous
        timestamp, newest timestamp, union of the changes) is broadcast, so all ranks decide alike
        even when a notice reached some of them a moment later.  ``skip_sync`` is True when hosts
        were only removed (the survivors' state is already equal)."""
        prev = last = self._last_updated_timestamp
        update = HostUpdate.NO_UPDATE
        while True:
            try:
                timestamp, res = self._host_messages.get_nowait()
            except queue.Empty:
                break
            if timestamp > last:
                last = timestamp
                update |= res
        prev, self._last_updated_timestamp, update = self._bcast_object((prev, last, int(update)))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(HostUpdate(update) == HostUpdate.REMOVED)

    def save(self) -> None:
        """Save the state in host memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Bring back the last saved state, undoing what changed since."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Make every rank's state equal to rank 0's."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Adjust to a new world after a reset, before ``sync()`` (nothing by default)."""


class ObjectState(State):
    """Picklable attributes given as keyword arguments (``ObjectState(epoch=0, batch=0)``)."""

    def __init__(self, bcast_object: Callable[[Any], Any] = broadcast_object,
                 get_rank: Callable[[], int] = rank, **kwargs: Any) -> None:
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def _set_attrs(self) -> None:
        # copies: changing an attribute in place must not change the committed value
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))

    def save(self) -> None:
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()


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
        self.value.load_state_dict(copy.deepcopy(self._saved))

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
