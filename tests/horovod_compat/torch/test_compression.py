"""Compression.none / Compression.fp16 (pure functions: no ranks needed) and fp16 on the wire."""
from __future__ import annotations

import pytest
import torch

from horovod_compat.torch import Compression


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fp16_round_trip_of_floating_tensors(dtype):
    t = torch.tensor([1.5, -2.25, 3.0], dtype=dtype)
    c, ctx = Compression.fp16.compress(t)
    assert c.dtype == torch.float16
    d = Compression.fp16.decompress(c, ctx)
    assert d.dtype == dtype and torch.equal(d, t)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_fp16_leaves_integer_tensors_alone(dtype):
    t = torch.tensor([1, 2, 3], dtype=dtype)
    c, ctx = Compression.fp16.compress(t)
    assert c is t
    assert Compression.fp16.decompress(c, ctx) is t


def test_none_is_identity():
    t = torch.ones(3)
    c, ctx = Compression.none.compress(t)
    assert c is t and ctx is None and Compression.none.decompress(c, ctx) is t


def test_fp16_loses_precision_like_horovod():
    t = torch.tensor([1.0 + 2 ** -12], dtype=torch.float32)
    c, ctx = Compression.fp16.compress(t)
    assert Compression.fp16.decompress(c, ctx).item() == 1.0
