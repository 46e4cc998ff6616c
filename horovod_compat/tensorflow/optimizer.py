"""``hvd.DistributedOptimizer`` for TensorFlow: a ``tf.compat.v1.train.Optimizer`` is wrapped here
(its ``compute_gradients`` averages the gradients across ranks; with ``op=Adasum``, Horovod's delta
optimizer: local steps whose weight deltas are combined with Adasum, ``_adasum``); a Keras optimizer
(Keras 3 or tf-keras) is handed to the Keras binding (``horovod_compat._keras``), as Horovod does
(which, as Horovod's, refuses ``op=Adasum``)."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from horovod_compat.common.ops import Adasum, Average
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from ._adasum import DeltaReducer
from .aggregation import LocalGradientAggregationHelper
from .compression import Compression
from .gradients import LocalVariables, reduce_gradients

__all__ = ["DistributedOptimizer"]


class _Wrapper(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer around the user's (``self._optimizer``): its slots and variables are the
    wrapped optimizer's."""

    _optimizer: tf.compat.v1.train.Optimizer

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


class _DistributedOptimizer(_Wrapper):
    """A TF1 optimizer whose gradients are averaged across ranks before they are applied; with
    ``backward_passes_per_step=N``, summed locally over N passes (averaged with
    ``average_aggregated_gradients``), averaged across ranks at the N-th, and applied only then,
    as Horovod's (the global step, too, counts applied steps).  The gradients of variables given
    to ``register_local_var`` stay this rank's (divided by the set's size with
    ``scale_local_gradients``)."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: Optional[str],
                 use_locking: bool, compression: Any, sparse_as_dense: bool, op: int,
                 gradient_predivide_factor: float, process_set: ProcessSet,
                 backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False,
                 scale_local_gradients: bool = True) -> None:
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._hvd = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                         gradient_predivide_factor=gradient_predivide_factor,
                         process_set=process_set)
        self._local = LocalVariables()
        self._scale_local_gradients = scale_local_gradients
        self._agg_helper = (LocalGradientAggregationHelper(backward_passes_per_step,
                                                           average_aggregated_gradients)
                            if backward_passes_per_step > 1 else None)

    @property
    def scale_local_gradients(self) -> bool:
        return self._scale_local_gradients

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient on this rank (not reduced across ranks), as Horovod's
        model-parallel API; call it before ``compute_gradients``/``minimize`` builds the step."""
        self._local.register(var)

    def _reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        return reduce_gradients(grads, variables, self._local, self._scale_local_gradients,
                                **self._hvd)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, Any]]:
        """The wrapped optimizer's gradients, averaged across ranks (one grouped allreduce); with
        ``backward_passes_per_step``, this pass's local gradients except at the N-th pass."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        if self._agg_helper is not None:
            return list(zip(self._agg_helper.aggregate(grads, variables, self._reduce),
                            variables))
        return list(zip(self._reduce(grads, variables), variables))

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's step; with ``backward_passes_per_step``, only at the passes
        that reduced (an op that does nothing on the others)."""
        if self._agg_helper is None:
            return self._optimizer.apply_gradients(grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        applied = self._agg_helper.gated(
            lambda: self._optimizer.apply_gradients(pairs, *args, **kwargs), [g for g, _ in pairs])
        return applied if tf.executing_eagerly() else applied.op


class _DistributedAdasumOptimizer(_Wrapper):
    """A TF1 optimizer that applies its local gradients, then combines the weight deltas across
    ranks with Adasum (every ``backward_passes_per_step`` steps); see ``_adasum``."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: Optional[str],
                 use_locking: bool, compression: Any, backward_passes_per_step: int,
                 process_set: ProcessSet) -> None:
        super().__init__(name=name or f"DistributedDelta{type(optimizer).__name__}",
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._adasum = DeltaReducer(backward_passes_per_step, compression, process_set)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, Any]]:
        """The wrapped optimizer's gradients, not reduced (the deltas are)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: Optional[str] = None) -> Any:
        """The wrapped optimizer's step with this rank's gradients, then the Adasum of the
        variables' deltas across ranks (an op that runs both, in a graph)."""
        pairs = list(grads_and_vars)
        variables = [v for g, v in pairs if g is not None]
        return self._adasum.step(variables, lambda: self._optimizer.apply_gradients(
            pairs, global_step=global_step, name=name))


def _is_keras_optimizer(optimizer: Any) -> bool:
    for mod in type(optimizer).__mro__:
        if mod.__module__.startswith(("keras.", "tf_keras.", "tensorflow.python.keras")):
            return True
    return False


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Optional[Any] = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wrap ``optimizer`` so that gradients are averaged across ranks before they are applied
    (``op=Adasum``, TF1 optimizers only: weight deltas combined with Adasum after local steps)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if _is_keras_optimizer(optimizer):
        if op == Adasum:  # Horovod 0.28.1's own refusal
            raise ValueError("op == Adasum is not supported yet with Keras")
        from horovod_compat._keras import create_distributed_optimizer

        return create_distributed_optimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if op == Adasum:
            return _DistributedAdasumOptimizer(optimizer, name, use_locking, compression,
                                               backward_passes_per_step, process_set)
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got "
                             f"{backward_passes_per_step}")
        return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense,
                                     op, gradient_predivide_factor, process_set,
                                     backward_passes_per_step, average_aggregated_gradients,
                                     scale_local_gradients)
    raise ValueError(f"Provided optimizer doesn't inherit from either legacy TensorFlow or Keras "
                     f"optimizer: {optimizer!r}")
