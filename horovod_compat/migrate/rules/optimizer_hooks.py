"""``hvd.DistributedOptimizer(...)`` where the DDP rewrite cannot be proven right -> the helper
``_native_distributed_optimizer(...)``: the same optimizer, averaging gradients on its own.

``optimizer.py`` wraps the model in DDP only when it can prove that every forward pass goes
through the wrapper. Real programs hand the model to other functions and classes, keep the
optimizer on an attribute (``self.optimizer = hvd.DistributedOptimizer(...)``), build it in a
``return``: then the proof fails. Horovod's own semantics need no proof: the optimizer averages
the gradients, whatever ran the forward pass. The helper (``helpers.py``) does that in plain
``torch.distributed``: gradient hooks start bucketed asynchronous ``all_reduce`` calls during
backward, and ``step()`` waits for them. The call is replaced where it stands, so it works in any
expression. Options with a native meaning are kept (``backward_passes_per_step``,
``compression=hvd.Compression.fp16``, ``op=hvd.Sum``), also when the script chose them at run time
(their constants then hold native values, rules/constants.py); the others leave the TODO.
"""
from __future__ import annotations

from typing import Dict, Optional

import libcst as cst

from horovod_compat.migrate.context import (
    HVD, RewriteContext, Rewritten, code_of, has_star_args, hvd_attr_name,
)
from horovod_compat.migrate.rules import constants

#: Horovod 0.28.1's parameters, in order.
PARAMETERS = ("optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
              "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense", "process_set")


def _arguments(call: cst.Call) -> Optional[Dict[str, cst.BaseExpression]]:
    given: Dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.keyword is None:
            if index >= len(PARAMETERS):
                return None
            given[PARAMETERS[index]] = arg.value
        else:
            given[arg.keyword.value] = arg.value
    return given if "optimizer" in given and set(given) <= set(PARAMETERS) else None


def _number(node: cst.BaseExpression) -> Optional[float]:
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.evaluated_value)
    return None


def rewrite(call: cst.Call, ctx: RewriteContext, why_not_ddp: str) -> Optional[Rewritten]:
    """The helper call for `call`, or None when an option has no native meaning here."""
    if has_star_args(call):
        return None
    given = _arguments(call)
    if given is None:
        return None
    aliases = ctx.hvd_aliases
    pieces = [code_of(given["optimizer"]).strip()]
    if "backward_passes_per_step" in given:
        pieces.append(f"backward_passes_per_step={code_of(given['backward_passes_per_step']).strip()}")
    compression = given.get("compression")
    if compression is not None:
        chosen = hvd_attr_name(compression, aliases)
        if chosen == "Compression.fp16":
            pieces.append(f"compression={constants.native_value(chosen, ctx)}")
        elif chosen != "Compression.none":
            value = constants.native_expression(compression, ctx)
            if value is None:
                return None
            pieces.append(f"compression={value}")
    op = given.get("op")
    if op is not None:
        name = hvd_attr_name(op, aliases)
        if name == "Sum":
            pieces.append('op="sum"')
        elif name == "Adasum":
            return None  # always Adasum: the TODO says it has no native equivalent
        elif name != "Average":
            value = constants.native_expression(op, ctx)
            if value is None:
                return None  # a run-time choice in a file that keeps Horovod: the TODO stays
            pieces.append(f"op={value}")
    factor = given.get("gradient_predivide_factor")
    if factor is not None and _number(factor) != 1.0:
        return None
    dense = given.get("sparse_as_dense")
    if dense is not None and code_of(dense).strip() != "False":
        return None
    if "process_set" in given:
        return None
    ctx.need_helper("_native_distributed_optimizer")
    ctx.need(HVD, "dist")
    text = f"_native_distributed_optimizer({', '.join(pieces)})"
    note = (f"-> {text}: the optimizer averages the gradients itself (gradient hooks, bucketed "
            f"async all_reduce), as Horovod's did; not DDP because {why_not_ddp}")
    return Rewritten(cst.parse_expression(text), note)
