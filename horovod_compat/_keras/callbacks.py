"""The behaviour of Horovod's Keras callbacks, shared by ``horovod.tensorflow.keras.callbacks`` and
``horovod.keras.callbacks`` (which bind it to ``tf.keras.callbacks.Callback``: Keras 3, or tf-keras
under ``TF_USE_LEGACY_KERAS=1``).

* ``BroadcastGlobalVariablesCallbackImpl``: rank ``root_rank``'s model weights on every rank at the
  start of training, and its model *and optimizer* variables at the end of the first batch (when
  the optimizer's slots exist), as Horovod does.  A model that builds on its first batch (a
  ``Sequential`` without an input shape, a subclassed model) has no weights at the start (under
  tf-keras, asking for them raises): its weights are broadcast as its first call creates them,
  before the first step runs, so that step starts from rank ``root_rank``'s weights on every rank
  (Horovod broadcast only after the first step). Where the root's model is built and others'
  are not (the root alone loaded a checkpoint), those build theirs from the root's input shapes
  at the start, and the broadcast follows.  Keras 3's ``model.weights`` leave out
  random-seed states, so each rank keeps its own dropout randomness.
* ``MetricAverageCallbackImpl``: the epoch-end logs averaged over the ranks.  One allgather of every
  rank's logs, so ranks whose logs differ (a metric only some ranks have) cannot deadlock; a key
  missing on some rank keeps its local value.
* ``LearningRateScheduleCallbackImpl`` / ``LearningRateWarmupCallbackImpl``: Horovod's schedules
  (a constant ``multiplier`` decays exponentially from ``start_epoch``; the warmup goes from
  ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``), setting the optimizer's learning
  rate variable (Keras 3 and tf-keras alike), with Horovod's momentum correction where the momentum
  is a variable (tf-keras legacy optimizers; Keras 3 / tf-keras optimizers keep momentum as a
  Python number that a traced step has already baked in, so it is left alone).

In a TF1 graph (tf-keras after ``tf.compat.v1.disable_eager_execution()``) the broadcasts run in
Keras' session and variables are read and set through ``keras.backend.get_value``/``set_value``
(one cached assign op per variable), as Horovod's callbacks do.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

from horovod_compat._keras import eval_in_session, in_tf1_graph
from horovod_compat.common.lifecycle import rank, size
from horovod_compat.tensorflow._keras_models import (
    build_like_source, counts, model_weights, on_first_build, optimizer_variables,
)
from horovod_compat.tensorflow.functions import allgather_object, broadcast_variables
from horovod_compat.tensorflow.gradients import LocalVariables

__all__ = ["BroadcastGlobalVariablesCallbackImpl", "MetricAverageCallbackImpl",
           "LearningRateScheduleCallbackImpl", "LearningRateWarmupCallbackImpl",
           "get_learning_rate", "set_learning_rate", "optimizer_variables", "is_variable"]


# ----------------------------------------------------------------------------- helpers

def is_variable(obj: Any) -> bool:
    """A ``tf.Variable`` or a Keras 3 variable."""
    if isinstance(obj, tf.Variable):
        return True
    try:
        import keras

        return isinstance(obj, keras.Variable)
    except (ImportError, AttributeError):  # pragma: no cover
        return False


def _to_float(value: Any) -> float:
    if in_tf1_graph() and (is_variable(value) or tf.is_tensor(value)):
        return float(np.asarray(tf.keras.backend.get_value(value)))  # through Keras' session
    if hasattr(value, "numpy"):
        value = value.numpy()
    return float(np.asarray(value))


def _assign(variable: Any, value: float) -> None:
    if in_tf1_graph():  # through Keras' session, reusing one assign op per variable
        tf.keras.backend.set_value(variable, value)
    else:
        variable.assign(value)


def _learning_rate_attr(optimizer: Any) -> Any:
    if hasattr(optimizer, "learning_rate"):
        return optimizer.learning_rate
    return optimizer.lr


def get_learning_rate(optimizer: Any) -> float:
    """The optimizer's current learning rate as a float."""
    return _to_float(_learning_rate_attr(optimizer))


def set_learning_rate(optimizer: Any, value: float) -> None:
    """Set the learning rate (its variable, so an already traced train step sees it)."""
    current = _learning_rate_attr(optimizer)
    if hasattr(current, "assign"):
        _assign(current, value)
    else:
        optimizer.learning_rate = value


# ----------------------------------------------------------------------------- broadcast

class BroadcastGlobalVariablesCallbackImpl:
    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.device = device
        self.broadcast_done = False
        self._local = LocalVariables()
        if local_variables is None:
            local_variables = []
        elif is_variable(local_variables):
            local_variables = [local_variables]
        elif not all(is_variable(v) for v in local_variables):
            raise ValueError("All local variables must be of tf.Variable type.")
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """Leave ``var`` out of the broadcasts (it stays as each rank has it)."""
        self._local.register(var)

    def _model_variables(self) -> List[Any]:
        return [v for v in model_weights(self.model) if v not in self._local]

    def _broadcast(self, variables: List[Any]) -> None:
        with tf.device(self.device):
            eval_in_session(broadcast_variables(variables, root_rank=self.root_rank))

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.broadcast_done:
            return
        # every rank must take part in the same broadcast: do it only if every rank has them
        every = counts(self.model)
        models = [m for m, _ in every]
        if min(models) == max(models) > 0:
            self._broadcast(self._model_variables())
        elif in_tf1_graph():
            return
        elif max(models) == 0:
            self._broadcast_when_built()
        elif models[self.root_rank] > 0:
            # the root's model is built (e.g. it alone loaded a checkpoint) and some others' are
            # not: they build theirs from the root's input shapes first, so that the first step
            # starts from the root's weights everywhere (Horovod broadcast after that step)
            build_like_source(self.model, None, every, self.root_rank,
                              "BroadcastGlobalVariablesCallback")
            self._broadcast(self._model_variables())

    def _broadcast_when_built(self) -> None:
        """The model builds on its first call, inside the first step: broadcast its weights right
        after that call created them, before the step reads them (``on_first_build``)."""
        on_first_build(self.model, self, lambda: self._broadcast(self._model_variables()))

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.broadcast_done:
            return
        variables = self._model_variables()
        variables += optimizer_variables(getattr(self.model, "optimizer", None))
        self._broadcast(variables)
        self.broadcast_done = True


# ----------------------------------------------------------------------------- metric average

class MetricAverageCallbackImpl:
    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device
        self._warned: set = set()

    def _average_metrics_in_place(self, logs: Optional[Dict[str, Any]]) -> None:
        if logs is None:
            return
        mine: Dict[str, float] = {}
        for key in sorted(logs):
            try:
                mine[key] = _to_float(logs[key])
            except (TypeError, ValueError):
                continue  # not a number (left as it is)
        everyone = allgather_object(mine)
        for key in sorted(mine):
            values = [d[key] for d in everyone if key in d]
            if len(values) != len(everyone):
                if key not in self._warned:
                    self._warned.add(key)
                    warnings.warn(f"MetricAverageCallback: metric {key!r} is not logged on every "
                                  "rank; it keeps this rank's value", RuntimeWarning)
                continue
            logs[key] = float(np.mean(np.asarray(values, dtype=np.float64)))

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._average_metrics_in_place(logs)


# ----------------------------------------------------------------------------- learning rate

class LearningRateScheduleCallbackImpl:
    def __init__(self, initial_lr: float, multiplier: Any, start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: Optional[int] = None
        self.restore_momentum: Optional[float] = None
        if callable(multiplier):
            self.multiplier: Callable[[float], float] = multiplier
        else:  # a constant: exponential decay from start_epoch
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self) -> int:
        params = getattr(self, "params", None) or {}
        if params.get("steps"):
            return int(params["steps"])
        if params.get("samples") and params.get("batch_size"):
            return int(params["samples"]) // int(params["batch_size"])
        raise ValueError(f"Could not autodetect the number of steps per epoch. Please specify "
                         f"the steps_per_epoch parameter to the {type(self).__name__}().")

    def _momentum_variable(self) -> Any:
        momentum = getattr(self.model.optimizer, "momentum", None)
        return momentum if hasattr(momentum, "assign") else None

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = get_learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        set_learning_rate(optimizer, new_lr)
        momentum = self._momentum_variable() if self.momentum_correction else None
        if momentum is not None and old_lr:
            # momentum correction (Goyal et al., 2017) for this batch only
            self.restore_momentum = _to_float(momentum)
            _assign(momentum, self.restore_momentum * new_lr / old_lr)

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            momentum = self._momentum_variable()
            if momentum is not None:
                _assign(momentum, self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.current_epoch = epoch

    def _in_range(self) -> bool:
        epoch = self.current_epoch
        return epoch is not None and epoch >= self.start_epoch and (
            self.end_epoch is None or epoch < self.end_epoch)

    def on_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._in_range():
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is not None:
            logs["lr"] = get_learning_rate(self.model.optimizer)


class LearningRateWarmupCallbackImpl(LearningRateScheduleCallbackImpl):
    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            # shifted by one batch so that each epoch ends on a round value (as Horovod)
            epoch += 1.0 / self.steps_per_epoch
            n = size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{get_learning_rate(self.model.optimizer):g}.")
