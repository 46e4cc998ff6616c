"""Elastic state objects: what is committed, restored after a failure, and synced from rank 0."""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

import torch

from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["State", "ObjectState", "TorchState"]


class State:
    """Base of elastic states: commit / restore / sync and reset callbacks (Horovod's interface)."""

    def __init__(self) -> None:
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called (in order) after every reset of the job, e.g. to rescale the lr."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for cb in self._reset_callbacks:
            cb()

    def on_hosts_updated(self, timestamp: Any = None, update_res: Any = None) -> None:
        """Host changes are not discovered in fixed-size jobs; kept for API compatibility."""

    def commit(self) -> None:
        """Save the current state as the point to restore after a failure."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Fixed-size jobs: nothing to check."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """State made of picklable attributes (``state.epoch``, ``state.batch``...), synced from rank 0."""

    def __init__(self, bcast_object: Callable[[Any], Any] = broadcast_object, **kwargs: Any) -> None:
        super().__init__()
        self._bcast_object = bcast_object
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()

    def _set_attrs(self) -> None:
        # copies: mutating an attribute in place must not change the committed value
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()


class TorchState(ObjectState):
    """Elastic state of a PyTorch job: a model, an optimizer, samplers and other attributes.

    ``TorchState(model, optimizer, epoch=0, batch=0)``; ``ElasticSampler`` attributes are handled
    too: on ``sync()`` every rank learns the samples processed by all ranks.
    """

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any) -> None:
        from .sampler import ElasticSampler
        self.model = model
        self.optimizer = optimizer
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        for k, v in self._samplers.items():
            setattr(self, k, v)
        plain = {k: v for k, v in kwargs.items() if k not in self._samplers}
        self._saved_model: Optional[Dict[str, Any]] = None
        self._saved_optimizer: Optional[Dict[str, Any]] = None
        self._saved_samplers: Dict[str, Any] = {}
        super().__init__(bcast_object=broadcast_object, **plain)
        self._save_torch()

    def _save_torch(self) -> None:
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self._saved_samplers = {k: copy.deepcopy(s.state_dict()) for k, s in self._samplers.items()}

    def save(self) -> None:
        self._save_torch()
        super().save()

    def restore(self) -> None:
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._saved_optimizer))
        for k, s in self._samplers.items():
            s.load_state_dict(copy.deepcopy(self._saved_samplers[k]))
        super().restore()

    def sync(self) -> None:
        """Make every rank equal to rank 0 (model, optimizer, attributes; samplers: union of the
        samples processed by any rank), then save that as the committed state."""
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        for s in self._samplers.values():
            s.sync()
        super().sync()
        self.save()
