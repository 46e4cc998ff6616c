"""``horovod.tensorflow.keras``: Horovod's Keras API for ``tf.keras`` -- Keras 3 (TensorFlow's
default since 2.16) or tf-keras (``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported).

``import horovod.tensorflow.keras as hvd`` gives the runtime's topology functions, the Keras
``DistributedOptimizer`` (``horovod_compat._keras``), value collectives that return tensors,
``load_model``, and the ``callbacks`` and ``elastic`` submodules."""
from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Sequence

import tensorflow as tf

from horovod_compat.tensorflow import (  # noqa: F401
    Adasum, Average, Compression, ProcessSet, Sum, add_process_set, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, init,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rank, remove_process_set, rocm_built, shutdown, size, start_timeline,
    stop_timeline,
)
from horovod_compat import _keras as _impl

keras = tf.keras  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1
K = keras.backend

from . import callbacks, elastic  # noqa: E402,F401

__all__ = [
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size",
    "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "Average", "Sum", "Adasum", "Compression", "DistributedOptimizer",
    "PartialDistributedOptimizer", "broadcast_global_variables", "allreduce", "allgather",
    "broadcast", "reducescatter", "load_model", "callbacks", "elastic",
]


def _check_groups(num_groups: int, groups: Any) -> Any:
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or
                                   (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    return groups


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: int = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """A copy of the Keras ``optimizer`` (same class, ``isinstance`` holds) whose gradients are
    averaged across ranks (``op``) before they are applied; see ``horovod_compat._keras``.

    ``backward_passes_per_step``: accumulate that many batches' gradients locally, then reduce and
    apply (divided by it with ``average_aggregated_gradients``).  ``groups``/``num_groups`` and
    the devices are accepted (every gradient already travels in one grouped allreduce)."""
    if op != Average and op != Sum:
        raise ValueError("op currently only supports Average and Sum")
    groups = _check_groups(num_groups, groups)
    return _impl.create_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)


def PartialDistributedOptimizer(optimizer: Any, name: Optional[str] = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: Any = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: int = Average,
                                groups: Any = None, process_set: ProcessSet = global_process_set,
                                local_layers: Any = None,
                                scale_local_gradients: bool = True) -> Any:
    """``DistributedOptimizer`` whose ``local_layers``' gradients stay on each worker."""
    if op != Average and op != Sum:
        raise ValueError("op currently only supports Average and Sum")
    groups = _check_groups(0, groups)
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    if not all(hasattr(layer, "trainable_weights") for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    opt = _impl.create_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1 sessions only; in TensorFlow 2 this raises as Horovod does: use
    ``callbacks.BroadcastGlobalVariablesCallback`` or ``hvd.broadcast_variables``."""
    return _impl.broadcast_global_variables(K, root_rank)


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[int] = None, compression: Any = Compression.none) -> Any:
    """Reduce a tensor-compatible value over all ranks (default: average); returns a tensor (in a
    TF1 graph: its value, run in Keras' session, as Horovod)."""
    return _impl.allreduce(K, value, name, average, prescale_factor, postscale_factor, op,
                           compression)


def allgather(value: Any, name: Optional[str] = None) -> Any:
    """Concatenate every rank's value along the first dimension; returns a tensor (in a TF1
    graph: its value)."""
    return _impl.allgather(K, value, name)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> Any:
    """Rank ``root_rank``'s value on every rank; returns a tensor (in a TF1 graph: its value)."""
    return _impl.broadcast(K, value, root_rank, name)


def reducescatter(value: Any, name: Optional[str] = None, op: int = Average) -> Any:
    """Reduce a value over all ranks and return this rank's block of rows."""
    return _impl.reducescatter(K, value, name, op)


def load_model(filepath: Any, custom_optimizers: Optional[Sequence[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None,
               compression: Any = Compression.none, legacy_opts: bool = False) -> Any:
    """Load a saved Keras model (Keras 3 ``.keras``, or tf-keras ``.h5``/``.keras``) with its
    optimizer wrapped in ``DistributedOptimizer``, keeping the optimizer's state.

    ``custom_optimizers``: optimizer classes of your own used by the model; ``custom_objects``: as
    in ``keras.models.load_model`` (a function ``**config -> optimizer`` is accepted as an
    optimizer's entry, as Horovod documents); ``legacy_opts``: the model uses
    ``tf.keras.optimizers.legacy`` optimizers (tf-keras)."""
    def wrap_optimizer(cls: type) -> Any:
        return lambda **kwargs: DistributedOptimizer(cls(**kwargs), compression=compression)

    return _impl.load_model(keras, wrap_optimizer, filepath, custom_optimizers, custom_objects,
                            legacy_opts, compression=compression)
