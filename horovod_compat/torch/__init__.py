"""``horovod.torch`` on ``torch.distributed``: the public namespace of ``import horovod.torch as hvd``.

A binding of the shared runtime (``horovod_compat.common``: lifecycle, process sets, negotiation,
transports, the runtime's collectives, timeline, stall inspector, elastic loop; see
docs/architecture.md).  What is torch's own lives here: the differentiable collectives, sparse
tensors and compression (``collectives``), ``functions`` (parameters and optimizer state),
``optimizer`` and ``_adasum``, ``sync_batch_norm`` and the torch elastic states (``elastic``).

``torch_group(process_set)`` (not in Horovod) gives the ``torch.distributed`` group behind a process
set, for code that wants to run native collectives on exactly the same ranks.
"""
from __future__ import annotations

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
from horovod_compat.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from horovod_compat.common.lifecycle import (  # noqa: F401
    add_process_set, get_process_set_ids_and_ranks, remove_process_set,
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size, start_timeline,
    stop_timeline, sycl_built,
)
from horovod_compat.common.process_sets import ProcessSet, global_process_set, torch_group  # noqa: F401
from horovod_compat.common import hooks  # noqa: F401
from horovod_compat.common.util import check_extension  # noqa: F401

__version__ = "0.28.1"


from . import elastic, functions, optimizer, sync_batch_norm  # noqa: E402,F401
from .functions import (  # noqa: E402,F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from .optimizer import DistributedOptimizer  # noqa: E402,F401
from .sync_batch_norm import SyncBatchNorm  # noqa: E402,F401
