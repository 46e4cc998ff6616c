"""``horovod.torch.mpi_ops``: the upstream module path of the collectives and lifecycle functions.

Scripts written against Horovod import from here (``from horovod.torch.mpi_ops import allreduce_async_,
synchronize``); every name is the same object as in ``horovod_compat.torch``.
"""
from .collectives import *  # noqa: F401,F403
from .collectives import __all__ as _coll_all
from .compression import Compression  # noqa: F401
from horovod_compat.common.exceptions import HorovodInternalError  # noqa: F401
from horovod_compat.common.lifecycle import *  # noqa: F401,F403
from horovod_compat.common.lifecycle import __all__ as _life_all
from horovod_compat.common.process_sets import *  # noqa: F401,F403
from horovod_compat.common.process_sets import __all__ as _ps_all


def handle_average_backwards_compatibility(op, average):  # noqa: ANN001, ANN201
    """Horovod helper: map the deprecated ``average=`` flag to an op (warns; both -> ValueError)."""
    from horovod_compat.common.collectives import resolve_op as _resolve_op

    return _resolve_op(average, op)


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Horovod helper used by Adasum: True when ``num_rank`` is a power of two."""
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


__all__ = list(_coll_all) + list(_life_all) + list(_ps_all) + [
    "Compression", "HorovodInternalError", "handle_average_backwards_compatibility",
    "check_num_rank_power_of_2"]
