"""``hvd.SyncBatchNormalization``: Keras batch normalization whose batch statistics are computed
over the samples of every rank (one grouped allreduce of the per-rank count, sum and sum of
squares per step), as Horovod's.  Works on Keras 3 and on tf-keras, whichever ``tf.keras`` is
(both compute the batch statistics in ``_moments``)."""
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

    def _moments(self, inputs: tf.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Keras 3 calls ``_moments(inputs, mask)``; tf-keras ``_moments(inputs, reduction_axes,
        keep_dims, mask=None)``: either way the statistics are the whole job's."""
        if _LEGACY:
            axes = args[0] if args else kwargs["reduction_axes"]
            keep_dims = args[1] if len(args) > 1 else kwargs.get("keep_dims", False)
            mask = args[2] if len(args) > 2 else kwargs.get("mask")
        else:
            axes, keep_dims = self._reduction_axes, False
            mask = args[0] if args else kwargs.get("mask")
        if mask is not None:
            return super()._moments(inputs, *args, **kwargs)
        return _global_moments(inputs, axes, keepdims=keep_dims)


#: tf-keras (``TF_USE_LEGACY_KERAS=1``): its batch normalization's ``_moments`` takes the axes.
_LEGACY = "keep_dims" in inspect.signature(tf.keras.layers.BatchNormalization._moments).parameters
