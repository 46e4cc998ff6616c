"""Thin adapter between the helper modules (functions, optimizer, sync_batch_norm, elastic) and the
core of ``horovod_compat.torch`` (lifecycle, collectives, process sets, compression).

Why it exists: the helpers want three things from the core -- "which torch ProcessGroup does this
process set mean", "what are the reduce-op constants", "what is Compression.none/fp16" -- and they
must keep working while the core evolves.  Every lookup is done lazily (at call time, never at import
time) so that ``horovod_compat.torch.__init__`` may re-export the helpers without import cycles.  When
a core module is missing, the adapter falls back to plain ``torch.distributed`` on the default group.
"""
from __future__ import annotations

import importlib
from typing import Any, Optional

import torch
import torch.distributed as dist

# Horovod's numeric op codes (fixed by the public API: Average=0, Sum=1, Adasum=2, Min=3, Max=4,
# Product=5).  Used only when the core does not provide the names.
_FALLBACK_OPS = {"Average": 0, "Sum": 1, "Adasum": 2, "Min": 3, "Max": 4, "Product": 5}

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


def _core_module(name: str) -> Optional[Any]:
    """Import ``horovod_compat.torch.<name>`` if it exists, else None."""
    try:
        return importlib.import_module(f"horovod_compat.torch.{name}")
    except ImportError:
        return None


def _core_attr(attr: str, modules: tuple = ("mpi_ops", "ops", "collectives", "basics", "process_sets",
                                             "compression", "exceptions")) -> Optional[Any]:
    """Find ``attr`` in the first core module that defines it (the package namespace first)."""
    pkg = importlib.import_module("horovod_compat.torch")
    if attr in getattr(pkg, "__dict__", {}):
        return pkg.__dict__[attr]
    for m in modules:
        mod = _core_module(m)
        if mod is not None and hasattr(mod, attr):
            return getattr(mod, attr)
    return None


def op(name: str) -> Any:
    """The core's reduce-op constant ``name`` (``"Average"``, ``"Sum"``, ``"Adasum"``...)."""
    value = _core_attr(name)
    return _FALLBACK_OPS[name] if value is None else value


def op_name(value: Any) -> str:
    """Name of a reduce op constant (compares with the core's constants, then Horovod's codes)."""
    for name in _FALLBACK_OPS:
        if value is op(name):
            return name
    for name in _FALLBACK_OPS:
        try:
            if value == op(name):
                return name
        except Exception:  # pragma: no cover - exotic op objects
            pass
    raise ValueError(f"Unknown reduce op: {value!r}")


def global_process_set() -> Any:
    """The core's ``global_process_set`` (None when the core has none yet: means the default group)."""
    return _core_attr("global_process_set", ("process_sets",))


def core_initialized() -> bool:
    """True when the core's ``hvd.init()`` has run (and ``shutdown()`` has not)."""
    is_init = _core_attr("is_initialized", ("lifecycle", "basics", "mpi_ops", "ops"))
    try:
        return bool(is_init()) if is_init is not None else False
    except Exception:
        return False


def check_initialized() -> None:
    """Raise Horovod's ValueError unless ``hvd.init()`` (or, failing that, torch.distributed's own
    ``init_process_group``, whose default group then stands for the global process set) has run."""
    if core_initialized():
        return
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(_NOT_INITIALIZED)


def _is_global(process_set: Any) -> bool:
    return process_set is None or process_set is global_process_set()


def torch_group(process_set: Any = None) -> Optional[dist.ProcessGroup]:
    """The ``torch.distributed`` group of a process set (None = the default/world group)."""
    check_initialized()
    if not core_initialized():
        if not _is_global(process_set):
            raise ValueError(_NOT_INITIALIZED)
        return None
    fn = _core_attr("torch_group", ("process_sets",))
    if fn is None:
        return None
    return fn(process_set if process_set is not None else global_process_set())


def shm_transport(process_set: Any = None) -> Optional[Any]:
    """The process set's shared-memory allreduce transport (``_shm.Transport``), or None when its
    data moves through the torch group (ranks on several hosts, transport disabled, no core)."""
    if not core_initialized():
        return None
    ps = process_set if process_set is not None else global_process_set()
    st = getattr(ps, "negotiation", None)
    return getattr(st, "shm", None)


def group_size(process_set: Any = None) -> int:
    """Number of ranks in the process set."""
    if core_initialized() and process_set is not None:
        n = process_set.size()
        if n is not None:
            return int(n)
    check_initialized()
    return dist.get_world_size(torch_group(process_set))


def group_rank(process_set: Any = None) -> int:
    """This process's rank inside the process set."""
    if core_initialized() and process_set is not None:
        r = process_set.rank()
        if r is not None:
            return int(r)
    check_initialized()
    return dist.get_rank(torch_group(process_set))


def group_ranks(process_set: Any = None) -> list:
    """Global ranks of the process set, sorted."""
    ranks = getattr(process_set, "ranks", None) if core_initialized() else None
    if ranks:
        return sorted(int(r) for r in ranks)
    return list(range(dist.get_world_size()))


def global_rank() -> int:
    """This process's global rank."""
    check_initialized()
    return dist.get_rank()


def compression_kind(compression: Any) -> str:
    """Classify a Horovod compressor: ``"none"``, ``"fp16"`` or ``"custom"``.

    The two built-in compressors get a fused fast path (fp16 buckets); anything else is applied
    tensor by tensor through its own ``compress``/``decompress``.
    """
    comp = _core_attr("Compression", ("compression",))
    if comp is not None:
        if compression is getattr(comp, "none", object()):
            return "none"
        if compression is getattr(comp, "fp16", object()):
            return "fp16"
    if compression is None:
        return "none"
    name = getattr(compression, "__name__", type(compression).__name__)
    if name in ("NoneCompressor",):
        return "none"
    if name in ("FP16Compressor",):
        return "fp16"
    return "custom"


def horovod_internal_error() -> type:
    """The core's ``HorovodInternalError`` class (RuntimeError until the core defines it)."""
    cls = _core_attr("HorovodInternalError", ("exceptions",))
    return cls if cls is not None else RuntimeError


def reduce_op_for(name: str) -> dist.ReduceOp:
    """torch ReduceOp used on the wire for a Horovod op (Average is a Sum plus scaling)."""
    return {"Average": dist.ReduceOp.SUM, "Sum": dist.ReduceOp.SUM, "Min": dist.ReduceOp.MIN,
            "Max": dist.ReduceOp.MAX, "Product": dist.ReduceOp.PRODUCT}[name]


def is_floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()
