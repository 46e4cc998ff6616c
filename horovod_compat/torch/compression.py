"""Gradient compression, as in ``horovod.torch.compression``.

``Compression.none`` passes tensors through; ``Compression.fp16`` casts floating-point tensors to
float16 before communication and back afterwards (halving the bytes on the wire).  Non-floating
tensors are never touched by fp16, exactly like Horovod.  A compressor is a class with two static
methods, so user-defined compressors written for Horovod keep working.
"""
from __future__ import annotations

from typing import Any, Tuple

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``; ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor itself, no context."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Cast floating-point tensors to float16 for the wire; ctx is the original dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            tensor = tensor.type(torch.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            tensor = tensor.type(ctx)
        return tensor


class Compression:
    """The built-in compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def kind(compressor: Any) -> str:
        """``"none"``, ``"fp16"`` or ``"custom"``: the two built-in compressors get fused fast paths
        (fp16 buckets); anything else is applied tensor by tensor."""
        if compressor is None or compressor is NoneCompressor:
            return "none"
        if compressor is FP16Compressor:
            return "fp16"
        return "custom"
