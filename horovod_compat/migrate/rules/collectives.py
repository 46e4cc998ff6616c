"""Tensor and object collectives used outside the optimizer: metric averaging and friends.

``hvd.allreduce(t)`` returns a *new* tensor and *averages* by default (integers truncate);
``dist.all_reduce(t)`` works in place and *sums*.  A bare ``dist.all_reduce`` would silently
change both, so these calls go to the small helpers in helpers.py that keep Horovod's meaning.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Union

import libcst as cst

from horovod_compat.migrate.context import (
    HVD,
    Flagged,
    Outcome,
    RewriteContext,
    Rewritten,
    code_of,
    has_star_args,
    hvd_attr_name,
    keyword_args,
    positional_args,
)
from horovod_compat.migrate.rules import constants

def _reduce_op(call: cst.Call, ctx: RewriteContext) -> Union[str, Flagged]:
    """The native op argument (source) for `op=` / `average=`: a literal constant as its string
    (``"sum"``), any other expression with its constants made native (rules/constants.py: the
    helper then receives the value the script chose at run time); a Flagged when neither works."""
    kw = keyword_args(call)
    op: Optional[str] = None
    if "op" in kw:
        value = kw["op"].value
        name = hvd_attr_name(value, ctx.hvd_aliases)
        if name == "Adasum":
            return Flagged("op=Adasum has no torch.distributed equivalent; it is not a plain average")
        op = constants.NATIVE_VALUES.get(name) if name and not name.startswith("Compression") else None
        if op is None:
            op = constants.native_expression(value, ctx)
        if op is None:
            return Flagged(f"op={code_of(value)} is not a Horovod reduce-op constant the rewriter can read")
    if "average" in kw:
        value = kw["average"].value
        if op is not None:
            return Flagged("both op= and average= given (Horovod raises ValueError)")
        if not (isinstance(value, cst.Name) and value.value in ("True", "False")):
            return Flagged(f"average={code_of(value)} is not a literal True/False")
        op = '"average"' if value.value == "True" else '"sum"'
    return op or '"average"'


def _native_options(call: cst.Call, ctx: RewriteContext, allowed: set) -> Union[List[str], Flagged]:
    """The helper's keyword arguments for `call`'s options (``compression=``, ``prescale_factor=``,
    ``postscale_factor=``, with constants made native), or a Flagged for an option it lacks."""
    options: List[str] = []
    for name, arg in keyword_args(call).items():
        if name in allowed:
            continue
        text = code_of(arg.value).strip()
        if name in ("prescale_factor", "postscale_factor") and text in ("1", "1.0"):
            continue
        if name == "compression" and text.endswith("Compression.none"):
            continue
        value = constants.native_expression(arg.value, ctx) \
            if name in ("compression", "prescale_factor", "postscale_factor") else None
        if value is None:
            return Flagged(f"argument {name}= is not rewritten (only tensor, op/average, name, "
                           "compression and the scale factors are)")
        options.append(f"{name}={value}")
    return options


def rewrite_allreduce(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.allreduce[_](t, op=..., name=...)`` -> ``_native_allreduce(t, "average"|...)``."""
    pos = positional_args(call)
    if has_star_args(call) or len(pos) != 1:
        return Flagged(f"hvd.{name}() needs exactly one positional tensor argument to be rewritten")
    options = _native_options(call, ctx, {"op", "average", "name"})
    if isinstance(options, Flagged):
        return options
    op = _reduce_op(call, ctx)
    if isinstance(op, Flagged):
        return op
    ctx.need_helper("_native_allreduce")
    if name == "allreduce_":
        options.append("inplace=True")
    text = f"_native_allreduce({', '.join([code_of(pos[0].value), op, *options])})"
    literal = op.strip('"')
    what = literal if op.startswith('"') else f"the op `{op}` holds"
    return Rewritten(
        cst.parse_expression(text),
        f'-> {what} over all ranks into a {"the same" if name == "allreduce_" else "new"} tensor'
        + (" (integers truncate)" if literal == "average" else ""),
    )


def rewrite_broadcast(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.broadcast[_](t, root_rank)`` -> ``_native_broadcast(t, root_rank)``."""
    pos = positional_args(call)
    kw = keyword_args(call)
    if has_star_args(call) or set(kw) - {"root_rank", "name"}:
        return Flagged(f"hvd.{name}() with process_set=/other arguments is not rewritten")
    if len(pos) == 2 and "root_rank" not in kw:
        root = pos[1].value
    elif len(pos) == 1 and "root_rank" in kw:
        root = kw["root_rank"].value
    else:
        return Flagged(f"hvd.{name}() arguments not understood")
    ctx.need_helper("_native_broadcast")
    inplace = ", inplace=True" if name == "broadcast_" else ""
    text = f"_native_broadcast({code_of(pos[0].value)}, {code_of(root)}{inplace})"
    return Rewritten(cst.parse_expression(text), "-> dist.broadcast of a copy")


def rewrite_broadcast_object(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.broadcast_object(obj, root_rank=0)`` -> ``dist.broadcast_object_list`` helper."""
    pos = positional_args(call)
    kw = keyword_args(call)
    if has_star_args(call) or set(kw) - {"root_rank", "name"} or not 1 <= len(pos) <= 2:
        return Flagged("hvd.broadcast_object() arguments not understood")
    if len(pos) == 2 and "root_rank" in kw:
        return Flagged("root_rank given twice")
    root = pos[1].value if len(pos) == 2 else kw["root_rank"].value if "root_rank" in kw else None
    ctx.need_helper("_native_broadcast_object")
    root_text = f", {code_of(root)}" if root is not None else ""
    text = f"_native_broadcast_object({code_of(pos[0].value)}{root_text})"
    return Rewritten(cst.parse_expression(text), "-> dist.broadcast_object_list")


def rewrite_allgather(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.allgather(tensor, name=None)`` -> the ``_native_allgather`` helper (rows per rank
    may differ, as in Horovod; differentiable)."""
    pos = positional_args(call)
    kw = keyword_args(call)
    given = min(len(pos), 1) + ("tensor" in kw)  # the tensor, positional or by keyword
    if has_star_args(call) or set(kw) - {"tensor", "name"} or given != 1 or len(pos) > 2 \
            or (len(pos) == 2 and "name" in kw):
        return Flagged("hvd.allgather() with a process set or arguments not understood; "
                       "use dist.all_gather(..., group=dist.new_group(ranks)) with padded sizes")
    tensor = pos[0].value if pos else kw["tensor"].value
    ctx.need_helper("_native_allgather")
    return Rewritten(cst.parse_expression(f"_native_allgather({code_of(tensor)})"),
                     "-> all_gather of the sizes, then of the padded tensors (uneven rows)")


def rewrite_allgather_object(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.allgather_object(obj)`` -> ``dist.all_gather_object`` helper (a list in rank order)."""
    pos = positional_args(call)
    if has_star_args(call) or len(pos) != 1 or set(keyword_args(call)) - {"name"}:
        return Flagged("hvd.allgather_object() arguments not understood")
    ctx.need_helper("_native_allgather_object")
    text = f"_native_allgather_object({code_of(pos[0].value)})"
    return Rewritten(cst.parse_expression(text), "-> dist.all_gather_object")


def rewrite_barrier(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.barrier()`` -> ``dist.barrier()`` (the global set; ``process_set=`` is flagged)."""
    if call.args:
        return Flagged("hvd.barrier(process_set=...): use dist.barrier(group=dist.new_group(ranks))")
    ctx.need(HVD, "dist")
    return Rewritten(cst.parse_expression("dist.barrier()"), "-> dist.barrier()")


CALLS: Dict[str, Callable[[str, cst.Call, RewriteContext], Outcome]] = {
    "allreduce": rewrite_allreduce,
    "allreduce_": rewrite_allreduce,
    "broadcast": rewrite_broadcast,
    "broadcast_": rewrite_broadcast,
    "broadcast_object": rewrite_broadcast_object,
    "allgather": rewrite_allgather,
    "allgather_object": rewrite_allgather_object,
    "barrier": rewrite_barrier,
}
