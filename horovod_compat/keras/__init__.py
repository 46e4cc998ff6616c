"""``horovod.keras``: Horovod's API for Keras programs.

Horovod's ``horovod.keras`` drove the standalone ``keras`` 2 package; here it drives whatever
``tf.keras`` is -- Keras 3, or tf-keras when ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is
imported -- with the same optimizer wrapper, callbacks and elastic state as
``horovod.tensorflow.keras`` (``horovod_compat._keras``).  Signatures are horovod.keras' own
(``allreduce`` averages by default; ``DistributedOptimizer``'s positional order), with
``horovod.tensorflow.keras``' extra keywords accepted."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import tensorflow as tf

from horovod_compat.tensorflow.keras import (  # noqa: F401  (the same objects)
    Adasum, Average, Compression, ProcessSet, Sum, add_process_set, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, init,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rank, remove_process_set, rocm_built, shutdown, size, start_timeline,
    stop_timeline,
)
from horovod_compat import _keras as _impl
from horovod_compat.tensorflow import keras as _tf_keras

keras = tf.keras
K = keras.backend

from . import callbacks, elastic  # noqa: E402,F401

__all__ = list(_tf_keras.__all__)  # the same names, horovod.keras' signatures where they differ


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: int = Average, num_groups: int = 0, groups: Any = None,
                         backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """A copy of the Keras ``optimizer`` whose gradients are averaged across ranks before they
    are applied (see ``horovod.tensorflow.keras.DistributedOptimizer``)."""
    return _tf_keras.DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)


PartialDistributedOptimizer = _tf_keras.PartialDistributedOptimizer
broadcast_global_variables = _tf_keras.broadcast_global_variables
allgather = _tf_keras.allgather
broadcast = _tf_keras.broadcast
reducescatter = _tf_keras.reducescatter


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = True,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[int] = None, compression: Any = Compression.none) -> Any:
    """Reduce a tensor-compatible value over all ranks; ``average=True`` (the default) averages,
    ``False`` sums; an explicit ``op`` takes precedence over the default ``average``."""
    if op is not None and average is True:
        average = None
    return _impl.allreduce(K, value, name, average, prescale_factor, postscale_factor, op,
                           compression)


def load_model(filepath: Any, custom_optimizers: Optional[Sequence[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None,
               compression: Any = Compression.none, legacy_opts: bool = False) -> Any:
    """Load a saved Keras model with its optimizer wrapped in ``DistributedOptimizer`` (state
    kept); see ``horovod.tensorflow.keras.load_model``."""
    def wrap_optimizer(cls: type) -> Any:
        return lambda **kwargs: DistributedOptimizer(cls(**kwargs), compression=compression)

    return _impl.load_model(keras, wrap_optimizer, filepath, custom_optimizers, custom_objects,
                            legacy_opts, compression=compression)
