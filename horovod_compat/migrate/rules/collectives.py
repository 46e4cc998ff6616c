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
    kw = {**_allreduce_positionals(call), **keyword_args(call)}
    op: Optional[str] = None
    if "op" in kw:
        value = kw["op"].value
        name = hvd_attr_name(value, ctx.hvd_aliases)
        if name == "Adasum":
            return Flagged("op=Adasum has no torch.distributed equivalent; it is not a plain average")
        op = constants.NATIVE_VALUES[name] if name in constants.REDUCE_OPS else None
        if op is None:
            op = constants.native_expression(value, ctx)
        if op is None:
            return Flagged(f"op={code_of(value)} is not a Horovod reduce-op constant the rewriter can read")
    if "average" in kw:
        value = kw["average"].value
        if op is not None:
            return Flagged("both op= and average= given (Horovod raises ValueError)")
        if isinstance(value, cst.SimpleString):  # hvd.allreduce(t, "loss"): a name meant, average= taken
            return '"average"' if value.evaluated_value else '"sum"'
        if not (isinstance(value, cst.Name) and value.value in ("True", "False")):
            return Flagged(f"average={code_of(value)} is not a literal True/False")
        op = '"average"' if value.value == "True" else '"sum"'
    return op or '"average"'


def _allreduce_positionals(call: cst.Call) -> Dict[str, cst.Arg]:
    """``hvd.allreduce(t, average, name)``: the arguments after the tensor, by their names in
    Horovod 0.28.1's signature. Code written for the name as second argument (``hvd.allreduce(t,
    "loss")``) passes it as `average`, a true value: Horovod averaged (and warned)."""
    return dict(zip(("average", "name"), positional_args(call)[1:]))


#: The options each helper takes besides its tensor and root (their values pass as written, with
#: Horovod's constants made native).
_ALLREDUCE_OPTIONS = {"compression", "prescale_factor", "postscale_factor", "process_set"}
_SET_OPTION = {"process_set"}


def _native_options(call: cst.Call, ctx: RewriteContext, allowed: set, options_taken: set
                    ) -> Union[List[str], Flagged]:
    """The helper's keyword arguments for `call`'s options in `options_taken` (constants made
    native; defaults left out), or a Flagged for an option the helper lacks. A ``process_set=``
    passes only where the whole file becomes native: the sets are then the helper's
    (``_NativeProcessSet``), not Horovod's."""
    options: List[str] = []
    for name, arg in keyword_args(call).items():
        if name in allowed:
            continue
        text = code_of(arg.value).strip()
        if name in ("prescale_factor", "postscale_factor") and text in ("1", "1.0"):
            continue
        if name == "compression" and text.endswith("Compression.none"):
            continue
        value = constants.native_expression(arg.value, ctx) if name in options_taken else None
        if name == "process_set" and not ctx.shared.all_native:
            value = None
        if value is None:
            return Flagged(f"argument {name}= is not rewritten"
                           + (" while Horovod calls remain in this file" if name == "process_set" else ""))
        if value != "None":
            options.append(f"{name}={value}")
    return options


def rewrite_allreduce(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.allreduce[_](t, op=..., name=...)`` -> ``_native_allreduce(t, "average"|...)``;
    ``hvd.allreduce_async[_]`` -> ``_native_allreduce_async`` (its handle has wait() and
    is_completed(): see rewrite_handle)."""
    pos = positional_args(call)
    if has_star_args(call) or not 1 <= len(pos) <= 3:
        return Flagged(f"hvd.{name}() needs its tensor, and at most average and name, as positional "
                       "arguments to be rewritten")
    if set(_allreduce_positionals(call)) & set(keyword_args(call)):
        return Flagged(f"hvd.{name}() is given an argument twice (Horovod raises TypeError)")
    is_async = name.startswith("allreduce_async")
    if is_async and not ctx.shared.all_native:
        return Flagged(f"hvd.{name}() stays while Horovod calls remain in this file (its handle "
                       "goes to hvd.synchronize/hvd.poll)")
    options = _native_options(call, ctx, {"op", "average", "name"}, _ALLREDUCE_OPTIONS)
    if isinstance(options, Flagged):
        return options
    op = _reduce_op(call, ctx)
    if isinstance(op, Flagged):
        return op
    inplace = name.endswith("_")
    if op == '"average"' and not (options or is_async or inplace or ctx.shared.calls_join):
        # (hvd.join() programs keep the full helper: its reductions tell joined ranks to take part)
        ctx.need_helper("_native_average")
        return Rewritten(cst.parse_expression(f"_native_average({code_of(pos[0].value)})"),
                         "-> the average over all ranks into a new tensor (integers truncate)")
    if op == '"sum"' and not (options or is_async or inplace or ctx.shared.calls_join):
        ctx.need_helper("_native_sum")
        return Rewritten(cst.parse_expression(f"_native_sum({code_of(pos[0].value)})"),
                         "-> the sum over all ranks into a new tensor")
    ctx.need_helper("_native_allreduce")
    if inplace:
        options.append("inplace=True")
    func = "_native_allreduce_async" if is_async else "_native_allreduce"
    text = f"{func}({', '.join([code_of(pos[0].value), op, *options])})"
    literal = op.strip('"')
    what = literal if op.startswith('"') else f"the op `{op}` holds"
    return Rewritten(
        cst.parse_expression(text),
        f'-> {"start of " if is_async else ""}{what} over all ranks into {"the same" if inplace else "a new"} tensor'
        + (" (integers truncate)" if literal == "average" else ""),
    )


def rewrite_handle(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.synchronize(h)`` -> ``h.wait()``, ``hvd.poll(h)`` -> ``h.is_completed()``: the
    handles of a file that became native all come from ``_native_allreduce_async``,
    ``_native_broadcast_async`` or ``_native_allgather_async``."""
    pos = positional_args(call)
    if has_star_args(call) or len(pos) != 1 or keyword_args(call):
        return Flagged(f"hvd.{name}() arguments not understood")
    if not ctx.shared.all_native:
        return Flagged(f"hvd.{name}() stays while Horovod calls remain in this file")
    method = "wait" if name == "synchronize" else "is_completed"
    handle = pos[0].value
    if not isinstance(handle, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) or handle.lpar:
        handle = handle.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return Rewritten(cst.parse_expression(f"{code_of(handle)}.{method}()"),
                     f"-> handle.{method}() of the native asynchronous allreduce")


def rewrite_broadcast(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.broadcast[_](t, root_rank)`` -> ``_native_broadcast(t, root_rank)``;
    ``hvd.broadcast_async[_]`` -> ``_native_broadcast_async`` (a handle, as rewrite_handle
    expects)."""
    is_async = name.startswith("broadcast_async")
    if is_async and not ctx.shared.all_native:
        return Flagged(f"hvd.{name}() stays while Horovod calls remain in this file (its handle "
                       "goes to hvd.synchronize/hvd.poll)")
    pos = positional_args(call)
    kw = keyword_args(call)
    options = _native_options(call, ctx, {"root_rank", "name"}, _SET_OPTION)
    if has_star_args(call) or isinstance(options, Flagged):
        return options if isinstance(options, Flagged) else Flagged(f"hvd.{name}() arguments not understood")
    if 2 <= len(pos) <= 3 and "root_rank" not in kw and not (len(pos) == 3 and "name" in kw):
        root = pos[1].value  # (a third is the name, which only labelled Horovod's op)
    elif len(pos) == 1 and "root_rank" in kw:
        root = kw["root_rank"].value
    else:
        return Flagged(f"hvd.{name}() arguments not understood")
    func = "_native_broadcast_async" if is_async else "_native_broadcast"
    ctx.need_helper(func)
    inplace = name.endswith("_")
    if inplace:
        options.append("inplace=True")
    text = f"{func}({', '.join([code_of(pos[0].value), code_of(root), *options])})"
    return Rewritten(cst.parse_expression(text), f"-> {'start of ' if is_async else ''}dist.broadcast "
                     + ("in place" if inplace else "of a copy"))


def rewrite_broadcast_object(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.broadcast_object(obj, root_rank=0, name=None)`` -> ``dist.broadcast_object_list``
    helper (the name, by keyword or third positional argument, dropped)."""
    pos = positional_args(call)
    kw = keyword_args(call)
    options = _native_options(call, ctx, {"root_rank", "name"}, _SET_OPTION)
    if isinstance(options, Flagged):
        return options
    if has_star_args(call) or not 1 <= len(pos) <= 3:
        return Flagged("hvd.broadcast_object() arguments not understood")
    if len(pos) >= 2 and "root_rank" in kw or len(pos) == 3 and "name" in kw:
        return Flagged("root_rank or name given twice")
    # the third positional argument is the name, which only labelled Horovod's op: dropped when
    # evaluating it can have no effect
    if len(pos) == 3 and not isinstance(pos[2].value, (cst.SimpleString, cst.ConcatenatedString,
                                                         cst.FormattedString, cst.Name, cst.Attribute)):
        return Flagged("hvd.broadcast_object() name argument not understood")
    root = pos[1].value if len(pos) == 2 else kw["root_rank"].value if "root_rank" in kw else None
    ctx.need_helper("_native_broadcast_object")
    args = [code_of(pos[0].value), *([code_of(root)] if root is not None else []), *options]
    return Rewritten(cst.parse_expression(f"_native_broadcast_object({', '.join(args)})"),
                     "-> dist.broadcast_object_list")


def rewrite_allgather(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.allgather(tensor, name=None)`` -> the ``_native_allgather`` helper (rows per rank
    may differ, as in Horovod; differentiable); ``hvd.allgather_async`` -> its handle
    (``_native_allgather_async``), where the whole file becomes native."""
    is_async = name == "allgather_async"
    if is_async and not ctx.shared.all_native:
        return Flagged(f"hvd.{name}() stays while Horovod calls remain in this file (its handle "
                       "goes to hvd.synchronize/hvd.poll)")
    pos = positional_args(call)
    kw = keyword_args(call)
    given = min(len(pos), 1) + ("tensor" in kw)  # the tensor, positional or by keyword
    options = _native_options(call, ctx, {"tensor", "name"}, _SET_OPTION)
    if isinstance(options, Flagged):
        return options
    if has_star_args(call) or given != 1 or len(pos) > 2 or (len(pos) == 2 and "name" in kw):
        return Flagged(f"hvd.{name}() arguments not understood")
    tensor = pos[0].value if pos else kw["tensor"].value
    func = "_native_allgather_async" if is_async else "_native_allgather"
    ctx.need_helper(func)
    return Rewritten(cst.parse_expression(f"{func}({', '.join([code_of(tensor), *options])})"),
                     "-> all_gather of the sizes, then of the padded tensors (uneven rows)"
                     + (", at once, behind a handle" if is_async else ""))


def rewrite_allgather_object(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.allgather_object(obj)`` -> ``dist.all_gather_object`` helper (a list in rank order)."""
    pos = positional_args(call)
    if has_star_args(call) or len(pos) != 1 or set(keyword_args(call)) - {"name"}:
        return Flagged("hvd.allgather_object() arguments not understood")
    ctx.need_helper("_native_allgather_object")
    text = f"_native_allgather_object({code_of(pos[0].value)})"
    return Rewritten(cst.parse_expression(text), "-> dist.all_gather_object")


def rewrite_barrier(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.barrier()`` -> ``dist.barrier()``; with a process set, over its group."""
    options = _native_options(call, ctx, set(), _SET_OPTION)
    if isinstance(options, Flagged) or positional_args(call) or has_star_args(call):
        return options if isinstance(options, Flagged) else Flagged("hvd.barrier() arguments not understood")
    ctx.need(HVD, "dist")
    group = f"group={options[0].split('=', 1)[1]}.group" if options else ""
    return Rewritten(cst.parse_expression(f"dist.barrier({group})"), f"-> dist.barrier({group})")


def rewrite_process_set(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.ProcessSet(ranks)`` / ``hvd.add_process_set(ranks_or_set)`` -> ``_NativeProcessSet(...)``
    (a dist.new_group with Horovod's rank()/size()/included()); ``hvd.remove_process_set(ps)`` ->
    ``_NativeProcessSet.remove(ps)``. Only where the whole file becomes native: Horovod's own
    calls cannot take the native sets."""
    pos = positional_args(call)
    if has_star_args(call) or len(pos) != 1 or keyword_args(call):
        return Flagged(f"hvd.{name}() arguments not understood")
    if not ctx.shared.all_native:
        return Flagged(f"hvd.{name}() stays while Horovod calls remain in this file (they need Horovod's sets)")
    ctx.need_helper("_NativeProcessSet")
    ctx.need(HVD, "dist")
    func = "_NativeProcessSet.remove" if name == "remove_process_set" else "_NativeProcessSet"
    return Rewritten(cst.parse_expression(f"{func}({code_of(pos[0].value)})"),
                     f"-> {func}: a dist.new_group of those ranks")


def rewrite_join(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.join()`` -> ``_native_join()``: the joined rank stands in with zeros for the others'
    optimizer steps and allreduces until every rank has joined, and returns the last one."""
    if has_star_args(call) or len(call.args) > 1 or set(keyword_args(call)) - {"device"}:
        return Flagged("hvd.join() arguments not understood")
    if not ctx.shared.all_native:
        return Flagged("hvd.join() stays while Horovod calls remain in this file (the native join "
                       "stands in only for native collectives)")
    ctx.need_helper("_native_join")
    return Rewritten(cst.parse_expression("_native_join()"),
                     "-> _native_join(): zeros for the others' optimizer steps and allreduces until all joined")


CALLS: Dict[str, Callable[[str, cst.Call, RewriteContext], Outcome]] = {
    "join": rewrite_join,
    "ProcessSet": rewrite_process_set,
    "add_process_set": rewrite_process_set,
    "remove_process_set": rewrite_process_set,
    "allreduce": rewrite_allreduce,
    "allreduce_": rewrite_allreduce,
    "allreduce_async": rewrite_allreduce,
    "allreduce_async_": rewrite_allreduce,
    "synchronize": rewrite_handle,
    "poll": rewrite_handle,
    "broadcast": rewrite_broadcast,
    "broadcast_": rewrite_broadcast,
    "broadcast_async": rewrite_broadcast,
    "broadcast_async_": rewrite_broadcast,
    "broadcast_object": rewrite_broadcast_object,
    "allgather": rewrite_allgather,
    "allgather_async": rewrite_allgather,
    "allgather_object": rewrite_allgather_object,
    "barrier": rewrite_barrier,
}
