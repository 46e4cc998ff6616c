"""``hvd.Compression`` for TensorFlow tensors: ``none`` and ``fp16`` (floating tensors travel as
float16 and come back in their own dtype; others are untouched), as in Horovod.  A compressor is a
class with static ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)``, so
user-defined compressors written for Horovod keep working."""
from __future__ import annotations

from typing import Any, Tuple

import tensorflow as tf

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface: compress a tensor for the wire, and decompress the reduced result."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating tensors travel as float16."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tf.cast(tensor, ctx) if ctx is not None else tensor


class Compression:
    """The compressors users pass as ``compression=``."""

    none = NoneCompressor
    fp16 = FP16Compressor
