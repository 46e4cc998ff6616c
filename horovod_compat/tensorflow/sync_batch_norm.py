"""``hvd.SyncBatchNormalization``: Keras batch normalization whose batch statistics are computed
over the samples of every rank (one grouped allreduce of the per-rank count, sum and sum of
squares per step), as Horovod's.  Works on Keras 3 (it overrides ``_moments``) and on tf-keras
(``_calculate_mean_and_var``), whichever ``tf.keras`` is."""
from __future__ import annotations

import inspect
from typing import Any, Sequence

import tensorflow as tf

from horovod_compat.common.ops import Sum
from horovod_compat.common.process_sets import global_process_set

from .mpi_ops import grouped_allreduce

__all__ = ["SyncBatchNormalization"]


def _global_moments(inputs: tf.Tensor, axes: Sequence[int], keepdims: bool) -> Any:
    x = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), list(axes))), x.dtype)
    local_sum = tf.reduce_sum(x, axis=axes, keepdims=True)
    local_sq = tf.reduce_sum(tf.square(x), axis=axes, keepdims=True)
    if global_process_set.size() > 1:
        count, local_sum, local_sq = grouped_allreduce(
            [tf.reshape(count, [1]), local_sum, local_sq], op=Sum)
        count = tf.reshape(count, [])
    mean = local_sum / count
    variance = tf.maximum(local_sq / count - tf.square(mean), 0.0)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """Batch normalization with statistics over the whole job's batch (training mode)."""

    def __init__(self, fused: Any = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if "fused" in inspect.signature(tf.keras.layers.BatchNormalization.__init__).parameters:
            kwargs["fused"] = False  # tf-keras; Keras 3 has no fused kernel
        super().__init__(**kwargs)

    # Keras 3
    def _moments(self, inputs: tf.Tensor, mask: Any) -> Any:
        if mask is not None:
            return super()._moments(inputs, mask)
        return _global_moments(inputs, self._reduction_axes, keepdims=False)

    # tf-keras
    def _calculate_mean_and_var(self, inputs: tf.Tensor, reduction_axes: Sequence[int],
                                keep_dims: bool, mask: Any = None) -> Any:
        if mask is not None:
            return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=mask)
        return _global_moments(inputs, reduction_axes, keepdims=keep_dims)
