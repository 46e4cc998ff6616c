"""``horovod.tensorflow`` on the shared runtime: the public namespace of
``import horovod.tensorflow as hvd``.

A thin binding of ``horovod_compat.common`` (the same runtime as ``horovod.torch``: one
``hvd.init()`` in a process that imports both gives both the same ranks, process sets and
timeline): ``mpi_ops`` moves TensorFlow tensors through the runtime's collectives and registers
Horovod's gradients; ``functions`` broadcasts variables and objects; ``gradient_tape`` and
``optimizer`` average gradients; ``sync_batch_norm`` and ``elastic`` as in Horovod.
``horovod.tensorflow.keras`` (and ``horovod.keras``) live in ``horovod_compat.tensorflow.keras``.
"""
from __future__ import annotations

from distributor.extras import require as _require

# (GPU users install their own `tensorflow` instead of the extra's CPU build)
_require("tensorflow", "horovod.tensorflow (and horovod.keras)")


def _not_for_autograph() -> None:
    """Keep AutoGraph out of this project's code, as it keeps out of TensorFlow's and Keras'.

    AutoGraph rewrites the Python that a ``tf.function`` calls (``if`` -> ``ag__.if_stmt``, every
    call through ``converted_call``), module by module, unless a rule of its ``CONVERSION_RULES``
    says not to. The binding's collectives are ``tf.numpy_function`` nodes whose Python runs again
    every time the graph runs: rewritten, a 1 MB allreduce called from a user's ``tf.function``
    took 3-5 ms instead of a fraction of one. Nothing here needs converting (these functions build
    graph ops; none branches on a tensor's value)."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:  # a TensorFlow that moved it: the code runs converted, only slower
        return
    mine = [config.DoNotConvert(prefix) for prefix in ("horovod_compat", "horovod")]
    config.CONVERSION_RULES = tuple(mine) + tuple(
        r for r in config.CONVERSION_RULES if not any(
            type(r) is type(m) and r._prefix == m._prefix for m in mine))


_not_for_autograph()

from horovod_compat.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from horovod_compat.common.util import check_extension  # noqa: F401

from .compression import Compression  # noqa: F401
from .util import _executing_eagerly  # noqa: F401  (Horovod's tests call hvd._executing_eagerly)
from .mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, ProcessSet, global_process_set,
    add_process_set, allgather, allreduce, alltoall, barrier, broadcast, broadcast_,
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, get_process_set_ids_and_ranks,
    gloo_built, gloo_enabled, grouped_allgather, grouped_allreduce, grouped_reducescatter, init,
    is_homogeneous, is_initialized, join, local_rank, local_rank_op, local_size, local_size_op,
    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, process_set_included_op, rank,
    rank_op, reducescatter, remove_process_set, rocm_built, shutdown, size, size_op,
    start_timeline, stop_timeline, sycl_built,
)
from .functions import (  # noqa: F401
    BroadcastGlobalVariablesHook, allgather_object, broadcast_global_variables, broadcast_object,
    broadcast_object_fn, broadcast_variables,
)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape  # noqa: F401
from .optimizer import DistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNormalization  # noqa: F401
from . import elastic  # noqa: F401,E402

__version__ = "0.28.1"
