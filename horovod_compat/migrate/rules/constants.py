"""Horovod constants used as values: reduce ops, compressors, the global process set and the
collective-failure exception, wherever the script keeps them.

Real programs do not always write ``op=hvd.Sum`` in the call: they keep the constant in a table
(``REDUCERS = {"sum": hvd.Sum, "mean": hvd.Average}``), a config field, a default argument, or
pass it through two functions before it reaches ``hvd.allreduce(t, op=op)`` or
``hvd.DistributedOptimizer(..., compression=compression)``. Following every such path is not
needed: each constant has one native value, written where the constant was, and the native code
that finally receives it (``_native_allreduce``, ``_native_distributed_optimizer``, a DDP comm
hook) understands that value. The decision stays where the script made it.

Native values:

* reduce ops -> the strings the helpers take: ``"average"``, ``"sum"``, ``"min"``, ``"max"``,
  ``"product"``; ``hvd.Adasum`` -> ``"adasum"``, which the optimizer helper refuses at run time
  with a message (Adasum has no torch.distributed equivalent), so only a run that chooses it fails;
* ``hvd.Compression.none`` -> ``None``; ``hvd.Compression.fp16`` -> DDP's
  ``default_hooks.fp16_compress_hook``: a DDP model registers it as its comm hook, the helpers
  read it as "reduce in float16";
* ``hvd.global_process_set`` -> ``None``: the helpers' default, every rank (a set made with
  ``hvd.add_process_set`` becomes a ``_NativeProcessSet``, collectives.py);
* ``hvd.HorovodInternalError`` -> ``dist.DistBackendError``, what a failed collective raises.

This applies only where the whole file becomes native (``SharedState.all_native``): a
Horovod call left in place must still receive Horovod's own constants.
"""
from __future__ import annotations

from typing import Dict, Optional, Set

import libcst as cst

from horovod_compat.migrate.context import HVD, RewriteContext, hvd_attr_name

#: Horovod's reduce-op constants.
REDUCE_OPS = ("Average", "Sum", "Min", "Max", "Product", "Adasum")
NATIVE_VALUES: Dict[str, str] = {
    "Average": '"average"',
    "Sum": '"sum"',
    "Min": '"min"',
    "Max": '"max"',
    "Product": '"product"',
    "Adasum": '"adasum"',
    "Compression.none": "None",
    "Compression.fp16": "default_hooks.fp16_compress_hook",
    "global_process_set": "None",
    "HorovodInternalError": "dist.DistBackendError",
}


def native_value(name: Optional[str], ctx: RewriteContext) -> Optional[str]:
    """The native source for ``hvd.<name>`` (recording the import it needs), or None when `name`
    is not a constant with a native value."""
    value = NATIVE_VALUES.get(name or "")
    if value is not None and "." in value:
        ctx.need(HVD, value.split(".")[0])  # default_hooks, dist
    return value


class _Replace(cst.CSTTransformer):
    def __init__(self, aliases: Set[str]) -> None:
        super().__init__()
        self.aliases = aliases
        self.found: Set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        name = hvd_attr_name(node, self.aliases)
        if name is not None:
            self.found.add(name)
        return name is None  # the outermost hvd.X.Y is the whole name: not its parts

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        value = NATIVE_VALUES.get(hvd_attr_name(original_node, self.aliases) or "")
        if value is None:
            return updated_node
        return cst.parse_expression(value).with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)


def native_expression(node: cst.BaseExpression, ctx: RewriteContext) -> Optional[str]:
    """The source of `node` with every Horovod constant in it replaced by its native value, or
    None when it uses another ``hvd.`` name, or a constant where native values are off (a file
    that keeps Horovod calls)."""
    replace = _Replace(ctx.hvd_aliases)
    out = node.visit(replace)
    if replace.found - set(NATIVE_VALUES) or (replace.found and not ctx.shared.all_native):
        return None
    for name in replace.found:
        native_value(name, ctx)
    code = cst.Module([]).code_for_node(out).strip()
    # An argument written over several lines (`named_parameters=\n  self.net.\n  named_parameters()`)
    # parses inside the call's parentheses, not on its own: it is kept whole in parentheses.
    return f"({code})" if "\n" in code else code
