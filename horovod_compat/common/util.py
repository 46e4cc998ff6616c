"""``horovod.common.util``: the small helpers Horovod-era scripts import from it.

There is no C++ extension to check or build here, so ``check_extension`` only verifies that the
framework itself imports.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import re
from typing import Any, Dict, Iterator, List, Sequence

__all__ = ["check_extension", "gpu_available", "split_list", "is_iterable", "env",
           "num_rank_is_power_2", "is_version_greater_equal_than"]


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: Any) -> None:
    """Horovod raised if its compiled extension was missing; ours is pure Python, so this only
    checks that the framework behind ``ext_name`` (e.g. ``horovod.torch``) can be imported."""
    framework = ext_name.split(".")[-1]
    if framework in ("torch", "tensorflow"):
        importlib.import_module(framework)


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """True when version ``ver`` (e.g. ``tf.__version__``) is at least ``target`` (their release
    numbers compared; a suffix such as ``rc0`` or ``+cpu`` is ignored)."""
    def release(v: str) -> tuple:
        return tuple(int(p) for p in re.findall(r"\d+", v.split("+")[0].split("rc")[0])[:3])
    return release(ver) >= release(target)


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """True when torch sees a CUDA device."""
    import torch

    return torch.cuda.is_available()


def split_list(items: Sequence[Any], n: int) -> List[Sequence[Any]]:
    """Split ``items`` into ``n`` nearly equal consecutive parts (the first ones one longer)."""
    d, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + d + (1 if i < r else 0)
        out.append(items[start:end])
        start = end
    return out


def is_iterable(x: Any) -> bool:
    """True for anything ``iter()`` accepts."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


def num_rank_is_power_2(num_rank: int) -> bool:
    """True when ``num_rank`` is a positive power of two (Adasum on CPU needs it in Horovod)."""
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


@contextlib.contextmanager
def env(**kwargs: Any) -> Iterator[None]:
    """Temporarily set environment variables (values are converted with ``str``)."""
    saved: Dict[str, Any] = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
