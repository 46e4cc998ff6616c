"""``hvd.elastic`` for TensorFlow: ``run`` (the runtime's elastic loop), ``TensorFlowState``
(variables and plain attributes) and ``TensorFlowKerasState`` (a Keras model, its optimizer and
plain attributes).  A commit copies the variables' values to host memory; ``restore`` assigns them
back; ``sync`` assigns rank 0's values on every rank (one fused broadcast)."""
from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Sequence, TypeVar

import tensorflow as tf

from horovod_compat.common import elastic as _elastic
from horovod_compat.common.elastic import ObjectState, State  # noqa: F401
from horovod_compat.common.exceptions import HorovodInternalError
from horovod_compat.common.lifecycle import rank

from .functions import broadcast_object, broadcast_variables

__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState"]

F = TypeVar("F", bound=Callable[..., Any])


def run(func: F) -> F:
    """Horovod's elastic loop (``horovod_compat.common.elastic.run``) for TensorFlow code.

    Inside ``tf.function`` (Keras' ``train_step``) a collective that failed because a peer left
    reaches the caller as ``tf.errors.UnknownError`` carrying the runtime's
    ``HorovodInternalError``; it is raised as ``HorovodInternalError`` here so that the loop
    restores the last commit and resets, as it does for an eager collective."""
    @functools.wraps(func)
    def unwrapped(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as exc:
            if "HorovodInternalError" in (exc.message or ""):
                raise HorovodInternalError(exc.message) from exc
            raise
    return _elastic.run(unwrapped)  # type: ignore[return-value]



class TensorFlowState(ObjectState):
    """``variables`` (default: ``tf.compat.v1.global_variables()`` in a TF1 graph) plus keyword
    attributes, saved on ``commit()`` and synced from rank 0."""

    def __init__(self, variables: Optional[Sequence[tf.Variable]] = None, session: Any = None,
                 **kwargs: Any) -> None:
        if variables is None:
            variables = tf.compat.v1.global_variables()
        self.variables = list(variables)
        self._values: List[Any] = []
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)
        self._save_variables()

    def _save_variables(self) -> None:
        self._values = [v.numpy().copy() for v in self.variables]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for v, value in zip(self.variables, self._values):
            v.assign(value)
        super().restore()

    def sync(self) -> None:
        if self.variables:
            broadcast_variables(self.variables, root_rank=0)
            self._save_variables()
        super().sync()


class TensorFlowKerasState(TensorFlowState):
    """A Keras ``model`` and ``optimizer`` (default: ``model.optimizer``) plus keyword attributes.

    The optimizer's variables are tracked once they exist (Keras creates them at the first step)."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(variables=self._all_variables(), **kwargs)

    def _all_variables(self) -> List[tf.Variable]:
        opt_vars = getattr(self.optimizer, "variables", None) if self.optimizer else None
        if callable(opt_vars):  # tf-keras v2 optimizers: a method
            opt_vars = opt_vars()
        # model.weights: on Keras 3 it leaves out the layers' seed-generator states, so that
        # each rank keeps its own dropout randomness
        return list(self.model.weights) + list(opt_vars or [])

    def save(self) -> None:
        self.variables = self._all_variables()
        super().save()

    def sync(self) -> None:
        self.variables = self._all_variables()
        super().sync()
