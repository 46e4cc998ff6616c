"""What the user's torch offers the rewritten code, read from the torch installed where the tool runs.

The rewriter runs in the user's environment, so the code it writes may use a torch API only when
that torch has it (issue: portable output). ``has(name)`` answers for the APIs the rules may write;
without an importable torch, the answer is that of the oldest torch ``setup.cfg`` allows
(``OLDEST``), from ``migration_guide/torch_apis.md``'s table, which a test checks against the
rules' output. ``HOROVOD_COMPAT_MIGRATE_TORCH_API`` (a comma-separated list of names, or empty)
replaces the reading: tests use it to write for an older torch.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
from typing import Callable, Dict, FrozenSet, Iterable, Tuple

# The APIs the rules may write beyond torch 2.1's DDP, each with how to find it in a torch.
def _replicate():
    from torch.distributed._composable import replicate  # noqa: F401


def _replicate_comm_hook():
    # the class replicate() gives a module; `replicate` itself names the function in the package
    replicate_module = importlib.import_module("torch.distributed._composable.replicate")
    assert callable(replicate_module.DDP.register_comm_hook)


def _forward_sync_buffers():
    from torch.nn.parallel import DistributedDataParallel
    assert "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters


CHECKS: Dict[str, Callable[[], None]] = {
    "replicate": _replicate,
    "replicate.register_comm_hook": _replicate_comm_hook,
    "DDP.forward_sync_buffers": _forward_sync_buffers,
}

#: What the oldest torch setup.cfg allows (2.1) has of CHECKS.
OLDEST: FrozenSet[str] = frozenset({"replicate"})

ENV = "HOROVOD_COMPAT_MIGRATE_TORCH_API"


@functools.lru_cache(maxsize=None)
def available() -> FrozenSet[str]:
    """The names of CHECKS that the torch here offers."""
    if ENV in os.environ:
        return frozenset(n.strip() for n in os.environ[ENV].split(",") if n.strip())
    try:
        import torch  # noqa: F401
    except ImportError:
        return OLDEST
    found = set()
    for name, check in CHECKS.items():
        try:
            check()
        except (ImportError, AttributeError, AssertionError, ValueError, TypeError):
            continue
        found.add(name)
    return frozenset(found)


def has(name: str) -> bool:
    if name not in CHECKS:
        raise KeyError(f"no check for torch API {name!r}")
    return name in available()


#: What rewritten code may use, how to spot it, and the first torch release that has it
#: (migration_guide/torch_apis.md lists the same; a test checks the two agree and that every
#: API the corpus's outputs use is here).
USED: Tuple[Tuple[str, str, str], ...] = (
    ("DistributedDataParallel", r"\bDDP\(|DistributedDataParallel\(", "1.0"),
    ("register_comm_hook, default_hooks.fp16_compress_hook", r"fp16_compress_hook", "1.8"),
    ("default_hooks.fp16_compress_wrapper", r"fp16_compress_wrapper", "1.9"),
    ("Tensor.register_post_accumulate_grad_hook", r"register_post_accumulate_grad_hook", "2.1"),
    ("torch.distributed.algorithms.join.Join", r"\bJoin\(\[", "1.10"),
    ("torch.distributed._composable.replicate", r"_composable import replicate", "2.1"),
    # (the DDP wrap's hooks go on `ddp_<model>`; any other receiver is a replicated module)
    ("register_comm_hook on a replicated module", r"^\s*(?!ddp_)[\w.]+\.register_comm_hook\(", "2.13"),
    ("DDP(forward_sync_buffers=...)", r"forward_sync_buffers=", "2.13"),
)


def _version(text: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def minimum_torch(sources: Iterable[str]) -> Tuple[str, str]:
    """The oldest torch the rewritten `sources` run on, by USED, and the API that sets it."""
    best = ("1.0", "DistributedDataParallel")
    for source in sources:
        for api, pattern, version in USED:
            if _version(version) > _version(best[0]) and re.search(pattern, source, re.M):
                best = (version, api)
    return best
