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
from horovod_compat.common.exceptions import HorovodInternalError, peer_failure
from horovod_compat.common.lifecycle import rank

from . import mpi_ops
from ._keras_models import (
    build_like_source, counts, model_weights, on_first_build, optimizer_variables,
)
from .functions import broadcast_object, broadcast_variables

__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState"]

F = TypeVar("F", bound=Callable[..., Any])


def run(func: F) -> F:
    """Horovod's elastic loop (``horovod_compat.common.elastic.run``) for TensorFlow code.

    Inside ``tf.function`` (Keras' ``train_step``) a collective that failed because a peer left
    reaches the caller as ``tf.errors.UnknownError`` carrying the runtime's
    ``HorovodInternalError``; it is raised as ``HorovodInternalError`` here (`internal_error`) so
    that the loop restores the last commit and resets, as it does for an eager collective."""
    @functools.wraps(func)
    def unwrapped(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as exc:
            error = internal_error(exc)
            if error is None:
                raise
            raise error from exc
    return _elastic.run(unwrapped)  # type: ignore[return-value]


def internal_error(exc: tf.errors.UnknownError) -> Optional[HorovodInternalError]:
    """The ``HorovodInternalError`` that `exc` (a graph node's failure) carries as text, None if it
    carries none. It names the rank that failed first and whether it froze, as the error the node
    raised did: the elastic loop reports a frozen peer to the driver from those, so that the next
    round does not wait for it."""
    message = exc.message or ""
    if "HorovodInternalError" not in message:
        return None
    cause = mpi_ops.node_error(message)
    if cause is None or not cause.knock_on:
        return HorovodInternalError(message)
    return peer_failure(message, cause.peer, cause.frozen)


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

    The model may build on its first batch (a ``Sequential`` without an input shape, a subclassed
    model) and the optimizer creates its slots at its first step: the state tracks whatever
    variables exist at each commit and sync. ``sync`` makes every rank match rank 0's:

    * no rank's model is built yet (a job's start): its weights are broadcast from rank 0 as the
      first batch creates them, before the first step runs (Horovod's KerasState read the weights
      at once, which tf-keras refuses for such a model);
    * some ranks' models or optimizers are built and others' are not (a worker that joined a
      running job, with a model that builds on its first batch): those ranks first build theirs
      from rank 0's input shapes and create their optimizer's slots, then everything is broadcast
      (Horovod's elastic Keras example runs one ``fit`` step before it makes the state, so that
      every rank has the same variables).
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(variables=self._all_variables(), **kwargs)

    def _all_variables(self) -> List[tf.Variable]:
        return model_weights(self.model) + optimizer_variables(self.optimizer)

    def save(self) -> None:
        self.variables = self._all_variables()
        super().save()

    def sync(self) -> None:
        self._build_like_the_others()
        self.variables = self._all_variables()
        super().sync()

    def _build_like_the_others(self) -> None:
        every = counts(self.model, self.optimizer)
        if len(set(every)) == 1:
            if every[0][0] == 0:
                on_first_build(self.model, self, lambda: broadcast_variables(
                    model_weights(self.model), root_rank=0))
            return
        models = [m for m, _ in every]
        source = models.index(max(models))  # rank 0, unless its model is the one not built
        build_like_source(self.model, self.optimizer, every, source, "KerasState.sync")
        every = counts(self.model, self.optimizer)
        if len(set(every)) != 1:
            raise ValueError(
                "KerasState.sync: the ranks' models and optimizers still have different numbers "
                f"of variables after building them like rank {source}'s: "
                f"{', '.join(f'rank {r}: {m} + {o}' for r, (m, o) in enumerate(every))} "
                "(model + optimizer); every rank must build the same model and optimizer")
