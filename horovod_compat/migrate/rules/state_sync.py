"""``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state`` -> native helpers.

When DistributedDataParallel wraps the same model right next to a ``broadcast_parameters`` of
that model from rank 0, the call is redundant (DDP broadcasts parameters and buffers from rank 0
when it is constructed) and optimizer.py removes it.  Everywhere else the call becomes a helper
that does exactly what Horovod did.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import libcst as cst

from horovod_compat.migrate.context import (
    Flagged,
    Outcome,
    RewriteContext,
    Rewritten,
    code_of,
    has_star_args,
    keyword_args,
    positional_args,
)


def split_args(call: cst.Call, extra: Tuple[str, ...] = ()) -> Optional[Tuple[cst.BaseExpression, cst.BaseExpression]]:
    """``(target, root_rank)`` of a broadcast helper call, or None when it is not that simple."""
    pos = positional_args(call)
    kw = keyword_args(call)
    if has_star_args(call) or set(kw) - {"root_rank", *extra}:
        return None
    if len(pos) == 2 and "root_rank" not in kw:
        return pos[0].value, pos[1].value
    if len(pos) == 1 and "root_rank" in kw:
        return pos[0].value, kw["root_rank"].value
    return None


def rewrite_broadcast_parameters(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.broadcast_parameters(params, root_rank=r)`` -> ``_native_broadcast_parameters(params, r)``."""
    args = split_args(call)
    if args is None:
        return Flagged("hvd.broadcast_parameters() arguments not understood (expected params, root_rank)")
    ctx.need_helper("_native_broadcast_parameters")
    text = f"_native_broadcast_parameters({code_of(args[0])}, root_rank={code_of(args[1])})"
    return Rewritten(cst.parse_expression(text), "-> dist.broadcast of every tensor from root_rank")


def rewrite_broadcast_optimizer_state(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.broadcast_optimizer_state(opt, root_rank=r)`` -> helper keeping Horovod's behaviour."""
    args = split_args(call)
    if args is None:
        return Flagged(
            "hvd.broadcast_optimizer_state() arguments not understood (expected optimizer, root_rank)"
        )
    ctx.need_helper("_native_broadcast_optimizer_state")
    text = f"_native_broadcast_optimizer_state({code_of(args[0])}, root_rank={code_of(args[1])})"
    return Rewritten(
        cst.parse_expression(text),
        "-> native helper (keeps Horovod's zero-gradient step on a fresh optimizer; see the guide)",
    )


CALLS: Dict[str, Callable[[str, cst.Call, RewriteContext], Outcome]] = {
    "broadcast_parameters": rewrite_broadcast_parameters,
    "broadcast_optimizer_state": rewrite_broadcast_optimizer_state,
}
