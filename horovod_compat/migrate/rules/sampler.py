"""``DistributedSampler(ds, num_replicas=hvd.size(), rank=hvd.rank())`` -> ``DistributedSampler(ds)``.

``torch.utils.data.DistributedSampler`` defaults ``num_replicas`` to ``dist.get_world_size()`` and
``rank`` to ``dist.get_rank()``, which is exactly what the Horovod arguments said once the
process group is initialized, so the arguments are dropped.  Any other value is kept (and its
``hvd.*`` calls are rewritten by topology.py).
"""
from __future__ import annotations

from typing import Set

import libcst as cst

from horovod_compat.migrate.context import RewriteContext, hvd_attr_name

_DEFAULTS = {"num_replicas": "size", "rank": "rank"}


def is_sampler(call: cst.Call) -> bool:
    """True for ``DistributedSampler(...)`` or ``<module>.DistributedSampler(...)``."""
    func = call.func
    name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
    return name == "DistributedSampler"


def _is_default(arg: cst.Arg, aliases: Set[str]) -> bool:
    value = arg.value
    return (
        arg.keyword is not None
        and arg.keyword.value in _DEFAULTS
        and isinstance(value, cst.Call)
        and not value.args
        and hvd_attr_name(value.func, aliases) == _DEFAULTS[arg.keyword.value]
    )


def rewrite_sampler(original: cst.Call, updated: cst.Call, ctx: RewriteContext, line: int) -> cst.Call:
    """Drop ``num_replicas=hvd.size()`` / ``rank=hvd.rank()`` (judged on the original call)."""
    drop = [i for i, arg in enumerate(original.args) if _is_default(arg, ctx.hvd_aliases)]
    if not drop:
        return updated
    args = [arg for i, arg in enumerate(updated.args) if i not in drop]
    if args and original.args[-1].comma is cst.MaybeSentinel.DEFAULT:
        # The source had no trailing comma; the argument now last must not get one either.
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    ctx.rewrite(line, "DistributedSampler", "num_replicas=/rank= dropped: the defaults are the world size and rank")
    return updated.with_changes(args=args)
