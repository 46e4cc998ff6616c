"""``hvd.DistributedOptimizer`` for TensorFlow: a ``tf.compat.v1.train.Optimizer`` is wrapped here
(its ``compute_gradients`` averages the gradients across ranks); a Keras optimizer (Keras 3 or
tf-keras) is handed to the Keras binding (``horovod_compat._keras``), as Horovod does."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import tensorflow as tf

from horovod_compat.common.ops import Average
from horovod_compat.common.process_sets import ProcessSet, global_process_set

from .compression import Compression
from .gradients import allreduce_gradients

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer whose gradients are averaged across ranks before they are applied."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: Optional[str],
                 use_locking: bool, compression: Any, sparse_as_dense: bool, op: int,
                 gradient_predivide_factor: float, process_set: ProcessSet) -> None:
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._hvd = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                         gradient_predivide_factor=gradient_predivide_factor,
                         process_set=process_set)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, Any]]:
        """The wrapped optimizer's gradients, averaged across ranks (one grouped allreduce)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        return list(zip(allreduce_gradients(grads, **self._hvd), variables))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


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
    """Wrap ``optimizer`` so that gradients are averaged across ranks before they are applied."""
    if _is_keras_optimizer(optimizer):
        from horovod_compat._keras import create_distributed_optimizer

        return create_distributed_optimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise ValueError("backward_passes_per_step > 1 is supported for Keras optimizers only; "
                             "accumulate the gradients yourself or use a Keras optimizer")
        return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense,
                                     op, gradient_predivide_factor, process_set)
    raise ValueError(f"Provided optimizer doesn't inherit from either legacy TensorFlow or Keras "
                     f"optimizer: {optimizer!r}")
