"""``horovod.torch`` on ``torch.distributed``: the public namespace of ``import horovod.torch as hvd``.

Core (this package's own modules): lifecycle and topology (``lifecycle``), collectives
(``collectives``), cross-rank checks and the stall inspector (``negotiation``), process sets
(``process_sets``), compression, exceptions, and the instrumentation point for the timeline
(``hooks``).  Helpers built on the core live in ``functions``, ``optimizer``, ``sync_batch_norm`` and
``elastic``; they are re-exported here when present.

``torch_group(process_set)`` (not in Horovod) gives the ``torch.distributed`` group behind a process
set, for code that wants to run native collectives on exactly the same ranks.
"""
from __future__ import annotations

import importlib as _importlib

from .collectives import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum,
    allgather, allgather_async, allreduce, allreduce_, allreduce_async, allreduce_async_,
    alltoall, alltoall_async, barrier, broadcast, broadcast_, broadcast_async, broadcast_async_,
    grouped_allgather, grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async, join, poll, reducescatter, reducescatter_async,
    sparse_allreduce_async, synchronize,
)
from .compression import Compression  # noqa: F401
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from .lifecycle import (  # noqa: F401
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size, start_timeline,
    stop_timeline, sycl_built,
)
from .process_sets import (  # noqa: F401
    ProcessSet, add_process_set, get_process_set_ids_and_ranks, global_process_set,
    remove_process_set, torch_group,
)
from . import hooks  # noqa: F401
from horovod_compat.common.util import check_extension  # noqa: F401

__version__ = "0.28.1"


def _optional(module: str, names: tuple) -> None:
    """Re-export ``names`` from the helper module ``module`` if that module exists.

    Only the module itself being absent is tolerated; an error inside an existing module propagates.
    """
    full = f"{__name__}.{module}"
    try:
        mod = _importlib.import_module(full)
    except ImportError as exc:
        if exc.name == full:
            return
        raise
    g = globals()
    g[module] = mod
    for n in names:
        if hasattr(mod, n):
            g[n] = getattr(mod, n)


_optional("functions", ("broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
                        "allgather_object"))
_optional("optimizer", ("DistributedOptimizer",))
_optional("sync_batch_norm", ("SyncBatchNorm",))
_optional("elastic", ())
