"""``--emulate``: ``hvd.DistributedOptimizer(...)`` where torch's data parallelism cannot be proven
right -> the helper ``_native_distributed_optimizer(...)``: the same optimizer, averaging gradients
on its own, as Horovod's did.

``optimizer.py`` wraps the model in DDP when it can prove that every forward pass goes through the
wrapper, and ``inplace.py`` makes the program's own module data-parallel (``replicate``) when it
can prove that is right. Where neither holds (``hvd.join()``, process sets, options passed as
``**kwargs``, an op chosen at run time, ...), the default is a TODO that says why: the road out is
DDP, and code that averages gradients in the user's file is Horovod under another name. A user
who needs Horovod's exact numbers meanwhile asks for them with ``--emulate``: then the call
becomes the helper (``helpers.py``), which needs no proof: gradient hooks start bucketed
asynchronous ``all_reduce`` calls during backward, and ``step()`` waits for them. The call is
replaced where it stands, with the same arguments: the helper takes Horovod's parameters
(compression, op, backward_passes_per_step, gradient_predivide_factor, sparse_as_dense,
process_set, ...), so options chosen at run time or passed as ``**kwargs`` keep working (their
Horovod constants hold native values, rules/constants.py). Only ``op=hvd.Adasum`` written as such
keeps the TODO.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from horovod_compat.migrate.context import (
    HVD, RewriteContext, Rewritten, hvd_attr_name,
)
from horovod_compat.migrate.rules import constants

#: Horovod 0.28.1's parameters, in order.
PARAMETERS = ("optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
              "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense", "process_set")


def rewrite(call: cst.Call, ctx: RewriteContext, why_not_ddp: str) -> Optional[Rewritten]:
    """The helper call for `call`: the same arguments (the helper has Horovod's parameters, so
    ``**kwargs``, positional options and run-time choices pass as they are, with their Horovod
    constants made native), or None when an argument cannot be made native: a name the helper
    does not take, always-Adasum, or a Horovod name other than a constant in an argument."""
    args = []
    for index, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if (keyword is not None and keyword not in PARAMETERS) or (arg.star == "" and keyword is None
                                                                    and index >= len(PARAMETERS)):
            return None
        if (keyword == "op" or (keyword is None and arg.star == "" and index == PARAMETERS.index("op"))) \
                and hvd_attr_name(arg.value, ctx.hvd_aliases) == "Adasum":
            return None  # always Adasum: the TODO says it has no native equivalent
        value = constants.native_expression(arg.value, ctx)
        if value is None:
            return None
        args.append(arg.with_changes(value=cst.parse_expression(value)))
    if not args:
        return None
    ctx.need_helper("_native_distributed_optimizer")
    ctx.need(HVD, "dist")
    node = call.with_changes(func=cst.Name("_native_distributed_optimizer"), args=args)
    note = (f"-> _native_distributed_optimizer(...), same arguments: the optimizer averages the "
            f"gradients itself (gradient hooks, bucketed async all_reduce), as Horovod's did; not "
            f"DDP because {why_not_ddp}")
    return Rewritten(node, note)


def could_rewrite(call: cst.Call, ctx: RewriteContext) -> bool:
    """Whether ``--emulate`` would rewrite `call` (for the TODO's advice), recording nothing in `ctx`.
    As in the pass that rewrites it: the one that aims at a native file (``all_native``)."""
    shared = dataclasses.replace(ctx.shared, all_native=True)
    return rewrite(call, RewriteContext(ctx.location, shared, ctx.line_offset), "") is not None
