"""``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state`` -> native helpers.

When DistributedDataParallel wraps the same model right next to a ``broadcast_parameters`` of
that model from rank 0, the call is redundant (DDP broadcasts parameters and buffers from rank 0
when it is constructed) and optimizer.py removes it.  A statement
``hvd.broadcast_parameters(M.state_dict(), root_rank=r)`` (the form Horovod's docs use) becomes
the two lines a person would write, a ``dist.broadcast`` of each tensor of the state_dict (its
tensors share storage with the module's); everywhere else the call becomes a helper that does
exactly what Horovod did with any params (a dict in sorted key order, pairs, tensors).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import libcst as cst

from horovod_compat.migrate.context import (
    HVD,
    Flagged,
    Outcome,
    RewriteContext,
    Rewritten,
    code_of,
    free_name,
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


def broadcast_parameters_statement(call: cst.Call, ctx: RewriteContext) -> Outcome:
    """A statement ``hvd.broadcast_parameters(M.state_dict(), root_rank=r)`` -> a loop of
    ``dist.broadcast`` over the state_dict's tensors; any other as a statement of the helper."""
    args = split_args(call)
    target = args[0] if args is not None else None
    if (isinstance(target, cst.Call) and not target.args and isinstance(target.func, cst.Attribute)
            and target.func.attr.value == "state_dict"):
        ctx.need(HVD, "dist")
        tensor = free_name("tensor", set(ctx.shared.names))  # (a name of the input is not reused)
        text = (f"for {tensor} in {code_of(target).strip()}.values():  # hvd.broadcast_parameters\n"
                f"    dist.broadcast({tensor}, src={code_of(args[1]).strip()})\n")
        return Rewritten([cst.parse_statement(text)], "-> dist.broadcast of each tensor of the state_dict")
    outcome = rewrite_broadcast_parameters("broadcast_parameters", call, ctx)
    if isinstance(outcome, Rewritten):
        outcome.node = [cst.SimpleStatementLine([cst.Expr(outcome.node)])]
    return outcome


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

#: Rewrites of a call that is a statement of its own (transform.py's STATEMENT_RULES).
STATEMENTS: Dict[str, Callable[[cst.Call, RewriteContext], Outcome]] = {
    "broadcast_parameters": broadcast_parameters_statement,
}
