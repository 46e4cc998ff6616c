"""``hvd.DistributedOptimizer`` -> the model wrapped in ``DistributedDataParallel``.

Horovod averages gradients in the optimizer; DDP averages them during ``backward()`` of a
forward pass that went through the DDP wrapper.  So the rewrite is only correct when *every*
forward pass of the model after the wrap goes through the wrapper.  This module proves that with
libcst's scope analysis before it rewrites anything:

* ``opt = hvd.DistributedOptimizer(inner, named_parameters=M.named_parameters(), ...)`` must be a
  statement of its own, with ``M`` a plain name;
* after that statement, ``M`` may only be called (``M(x)`` becomes ``ddp_M(x)``) or have
  attributes read (``M.train()``, ``M.state_dict()`` stay on the plain module, so checkpoints
  keep their keys); passing ``M`` to other code, calling ``M.forward`` or re-binding ``M`` makes
  the rewriter leave the optimizer in place with a TODO;
* every option must have a native meaning: ``compression=fp16`` -> DDP's fp16 comm hook;
  ``groups``/``num_groups`` only grouped tensors for fusion (DDP buckets on its own) and are
  dropped; ``backward_passes_per_step=N`` -> ``no_sync()`` when the loop has the one shape
  accumulation.py can prove; ``op=hvd.Sum`` -> a comm hook that sums (``_native_sum_gradients``,
  in torch's ``fp16_compress_wrapper`` with fp16 compression); ``op=hvd.Adasum`` -> DDP's
  averaging, named at the wrap's line (DDP has no Adasum); ``process_set=S`` ->
  ``process_group=S.group``; a predivide factor (with Average) is dropped; other ops and
  ``sparse_as_dense`` are flagged.

Code that reads or clips gradients (``p.grad``, ``clip_grad_norm_``) without calling
``opt.synchronize()`` first is placed by gradient_reads.py: after a ``step()`` it sees averaged
gradients under both; between ``backward()`` and ``step()`` it ran, under Horovod, while their
averaging was still in flight, and under DDP sees them averaged: the wrap goes ahead and a comment
above the read names the difference; a read the rewriter cannot place (a method called from
where it cannot follow) gets a comment that names both cases: the same gradients once the step
ran, averaged already where Horovod's were in flight.

It also removes what DDP makes redundant: ``opt.synchronize()``, ``with opt.skip_synchronize():``
(DDP gradients are already averaged after ``backward()``), and a ``broadcast_parameters`` of ``M``
from rank 0 placed right next to the wrap (DDP broadcasts parameters and buffers from rank 0 when
it is built).

``hvd.join()`` right after the training loop that runs the wrapped model becomes DDP's ``Join``
around that loop (`_plan_join`: only where that loop calls no other collective, which Join would
not shadow). A join that ends a loop this file does not show (a base class's) becomes
``dist.barrier()``, the equal-steps assumption named at its line (`_plan_barriers`), for the DDP
wrap and the in-place rewrite alike.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import libcst as cst
from libcst.metadata import CodeRange, GlobalScope, Scope

from horovod_compat.migrate import torch_api
from horovod_compat.migrate.context import (
    HVD,
    RewriteContext,
    free_name,
    Rewritten,
    code_of,
    has_star_args,
    hvd_attr_name,
    keyword_args,
    positional_args,
    without_comments,
)
from horovod_compat.migrate.rules import constants, dataflow, inplace, parameter_use
from horovod_compat.migrate.rules.gradient_reads import Read, Where, gradient_reads
from horovod_compat.migrate.rules.accumulation import Accumulation, plan_accumulation, reevaluable


#: How the TODO for gradients read before they are averaged starts: a bug in the input under
#: Horovod too, which no rewrite should hide (``optimizer_hooks`` leaves it).
GRADIENTS_READ = "gradients are read or clipped"


@dataclasses.dataclass
class OptimizerPlan:
    """What the transformer must do for the DistributedOptimizer rewrite, keyed by original node."""

    replace: Dict[cst.SimpleStatementLine, Rewritten] = dataclasses.field(default_factory=dict)
    flagged: Dict[cst.Call, str] = dataclasses.field(default_factory=dict)
    rename: Dict[cst.Name, str] = dataclasses.field(default_factory=dict)
    remove: Dict[cst.SimpleStatementLine, str] = dataclasses.field(default_factory=dict)
    unwrap: Set[cst.With] = dataclasses.field(default_factory=set)
    accumulate: Dict[cst.For, Tuple[Accumulation, str]] = dataclasses.field(default_factory=dict)
    #: Horovod constants of a run-time choice bound to a name -> their native value (dataflow.py).
    constants: Dict[cst.Attribute, str] = dataclasses.field(default_factory=dict)
    #: Calls made data-parallel in place (inplace.py): the call becomes its inner optimizer.
    inplace: Dict[cst.Call, "inplace.InPlace"] = dataclasses.field(default_factory=dict)
    #: A comment to put above a statement: a difference from Horovod named at its line.
    comments: Dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
    #: Training loops that hvd.join() ended -> the DDP module of ``with Join([...]):`` around them.
    join_loops: Dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
    #: Statements replaced whole (``last = hvd.join()``, a join that becomes a barrier), with the report's note.
    substitute: Dict[cst.SimpleStatementLine, Rewritten] = dataclasses.field(default_factory=dict)
    #: ``model.forward`` attributes of a replicated model's calls: each becomes ``model`` (inplace.py).
    forwards: Set[cst.Attribute] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Facts:
    """Metadata the analysis reads (resolved once by the engine)."""

    positions: Mapping[cst.CSTNode, CodeRange]
    scopes: Mapping[cst.CSTNode, Optional[Scope]]
    parents: Mapping[cst.CSTNode, cst.CSTNode]
    names_in_module: Set[str]
    names_elsewhere: Set[str]
    #: the module's source with comments blanked out (context.without_comments)
    module_code: str

    @functools.cached_property
    def gradient_reads(self) -> List[Read]:
        """The module's gradient reads, placed (gradient_reads.py): one walk, whichever
        DistributedOptimizer asks."""
        return gradient_reads(self.module_code, self.positions, self.parents)


class _FindOptimizers(cst.CSTVisitor):
    def __init__(self, aliases: Set[str]) -> None:
        self.aliases = aliases
        self.calls: List[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if hvd_attr_name(node.func, self.aliases) == "DistributedOptimizer":
            self.calls.append(node)


def _start(facts: _Facts, node: cst.CSTNode) -> Tuple[int, int]:
    pos = facts.positions[node].start
    return pos.line, pos.column


_inside = inplace.inside


def _literal(node: Optional[cst.BaseExpression]) -> Optional[str]:
    return None if node is None else code_of(node).strip()


@dataclasses.dataclass
class _Options:
    """What a DistributedOptimizer's options become natively (see dataflow.py for choices)."""

    error: Optional[str] = None
    #: When to register DDP's fp16 comm hook: "True", "False", a condition, or None when a
    #: named choice decides (then the hook is the variable's value, `hook_name`).
    fp16: Optional[str] = "False"
    hook_name: Optional[str] = None
    #: A comment for the line that tests `hook_name`, when its value comes from elsewhere.
    hook_comment: str = ""
    #: When Horovod would have used Adasum: "False" (never), "True" (always) or a condition. DDP
    #: has no Adasum: the gradients are averaged then, a difference named at the wrap's line.
    adasum: str = "False"
    #: When op=hvd.Sum: "False" (never), "True" (always) or a condition; then the gradients are
    #: summed (a comm hook), not averaged.
    sum: str = "False"
    passes: str = "1"
    #: process_set=S: the process group DDP reduces over (None: every rank).
    process_group: Optional[str] = None
    notes: List[str] = dataclasses.field(default_factory=list)
    #: Horovod constants bound to names, replaced in place by their native values.
    constants: Dict[cst.Attribute, str] = dataclasses.field(default_factory=dict)

    def adasum_comment(self) -> str:
        """The end of the wrap line's comment that names averaging in place of Adasum, or ""."""
        if self.adasum == "False":
            return ""
        when = "" if self.adasum == "True" else f" when {self.adasum}"
        return f"Horovod: Adasum{when}; DDP averages"

    def comm_hook_lines(self, module: str, ctx: RewriteContext, state: Optional[str] = None) -> List[str]:
        """The lines that register the compression's comm hook on `module` (a DDP wrapper or a
        replicated module), when one is chosen; `state`, the hook's state: the process group it
        reduces over (by default the set's, or None: every rank)."""
        state = state or self.process_group or "None"
        if self.sum != "False":
            # fp16: "True", "False" or a condition; a named hook holds fp16_compress_hook or None
            fp16 = self.fp16 if self.hook_name is None else f"{self.hook_name} is not None"
            ctx.need_helper("_native_sum_gradients")
            note = "# op=hvd.Sum: gradients summed, not averaged"
            hook = "_native_sum_gradients"
            if fp16 != "False":
                ctx.need(HVD, "default_hooks")
                sent_as_fp16 = "default_hooks.fp16_compress_wrapper(_native_sum_gradients)"
                hook = sent_as_fp16 if fp16 == "True" else f"{sent_as_fp16} if {fp16} else {hook}"
                note += ", sent as float16" if fp16 == "True" else ""
            line = f"{module}.register_comm_hook({state}, {hook})  {note}\n"
            if self.sum == "True":
                return [line]
            lines = [f"if {self.sum}:\n    {line}"]
            if fp16 != "False":  # (averaged otherwise, compressed as chosen)
                lines.append(f"elif {fp16}:\n" if fp16 != "True" else "else:\n")
                lines.append(f"    {module}.register_comm_hook({state}, default_hooks.fp16_compress_hook)\n")
            return ["".join(lines)]
        if self.fp16 != "False" or any("fp16" in v for v in self.constants.values()):
            ctx.need(HVD, "default_hooks")
        if self.hook_name is not None:
            return [f"if {self.hook_name} is not None:{self.hook_comment}\n"
                    f"    {module}.register_comm_hook({state}, {self.hook_name})\n"]
        if self.fp16 == "True":
            return [f"{module}.register_comm_hook({state}, default_hooks.fp16_compress_hook)\n"]
        if self.fp16 != "False":
            return [f"if {self.fp16}:\n    {module}.register_comm_hook({state}, default_hooks.fp16_compress_hook)\n"]
        return []


#: The constants DDP can take, with their native values (rules/constants.py).
_COMPRESSION = {c: constants.NATIVE_VALUES[c] for c in ("Compression.none", "Compression.fp16")}
#: The reduce ops DDP can take: Average (its own), Sum (a comm hook), Adasum (averaged, named).
_OPS = ("Average", "Sum", "Adasum")


def _when(choice: dataflow.Choice, constant: str) -> str:
    """Python source, true when `choice` picks the Horovod `constant`: "True" when it is the only
    one, a test of the name that holds the choice (its native value), or the expression's condition."""
    if choice.constants == {constant}:
        return "True"
    if choice.name is not None:
        return f"{choice.name} == {constants.NATIVE_VALUES[constant]}"
    return dataflow.condition(choice.tree, {constant}, choice.leaves)


def _choice(call: cst.Call, keyword: str, facts: "_Facts", ctx: RewriteContext):
    """The Choice passed as `keyword` (dataflow.resolve), with the scope of the call."""
    return dataflow.resolve(keyword_args(call)[keyword].value, ctx.hvd_aliases,
                            facts.scopes.get(call), facts.parents, ctx.shared.all_native)


def _check_options(call: cst.Call, ctx: RewriteContext, facts: "_Facts") -> _Options:
    """What the options of a DistributedOptimizer call become, or the error (a TODO).

    ``backward_passes_per_step`` may be any expression without side effects here; whether the
    loop allows the no_sync() rewrite is decided by accumulation.py once the model's calls are known.
    """
    kw = keyword_args(call)
    known = {"optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
             "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense"}
    for name in kw:
        if name not in known | {"process_set"}:
            return _Options(f"unknown argument {name}=")
    options = _Options()
    if "process_set" in kw:
        value = kw["process_set"].value
        if hvd_attr_name(value, ctx.hvd_aliases) != "global_process_set":  # (every rank: DDP's default)
            if not (ctx.shared.all_native and reevaluable(value)):
                return _Options(f"process_set={code_of(value).strip()}: DDP takes the set's process group "
                                "(process_group=), which the rewriter gives only for a set held in a name or "
                                "attribute of a file that becomes native")
            name = code_of(value).strip()
            # (the native process set: a _NativeProcessSet, or None for hvd.global_process_set)
            options.process_group = f"None if {name} is None else {name}.group"
            options.notes.append(f"process_set={name} -> process_group={name}.group")
    if "compression" in kw:
        choice = _choice(call, "compression", facts, ctx)
        value = kw["compression"].value
        if not isinstance(choice, dataflow.Choice) and ctx.shared.all_native and reevaluable(value) and not (
                isinstance(value, cst.Integer) or isinstance(value, cst.Name) and value.value in ("None", "True", "False")):
            # a value from elsewhere (a parameter, an attribute, a config field): every Horovod
            # compressor of a native file is DDP's fp16 hook or None, and so is this value
            choice = dataflow.Choice({}, table=True, lookup=code_of(value).strip())
            options.hook_comment = "  # fp16_compress_hook or None (hvd.Compression.fp16/none, once its caller is migrated)"
        if not isinstance(choice, dataflow.Choice):
            why = f" ({choice})" if isinstance(choice, str) else ""
            return _Options(f"compression={code_of(kw['compression'].value)} is not Compression.none/fp16 "
                            f"or a choice between them{why}")
        unknown = choice.constants - set(_COMPRESSION)
        if unknown:
            return _Options(f"compression=hvd.{sorted(unknown)[0]} is not Compression.none/fp16")
        if choice.lookup is not None and len(choice.constants) != 1:
            if not ctx.shared.all_native:
                return _Options(f"compression={choice.lookup}: the table keeps Horovod's compressors "
                                "while Horovod calls remain in this file")
            options.fp16, options.hook_name = None, choice.lookup
            options.notes.append(f"`{choice.lookup}` now gives DDP's fp16 comm hook or None")
        elif choice.name is not None and len(choice.constants) > 1:
            options.fp16, options.hook_name = None, choice.name
            options.constants.update({leaf: _COMPRESSION[c] for leaf, c in choice.leaves.items()})
            options.notes.append(f"`{choice.name}` now holds DDP's fp16 comm hook or None")
        elif choice.lookup is not None:  # (one compressor in the table: the lookup gives it)
            options.fp16 = "True" if choice.constants == {"Compression.fp16"} else "False"
        elif choice.tree is not None:
            options.fp16 = dataflow.condition(choice.tree, {"Compression.fp16"}, choice.leaves)
        else:
            options.fp16 = "True" if choice.constants == {"Compression.fp16"} else "False"
            options.constants.update({leaf: _COMPRESSION[c] for leaf, c in choice.leaves.items()})
    if "backward_passes_per_step" in kw:
        options.passes = _literal(kw["backward_passes_per_step"].value)
        if options.passes.isdigit() and int(options.passes) < 1:
            return _Options(f"backward_passes_per_step={options.passes} must be at least 1")
        single = _one_backward_per_step(call, facts) if options.passes != "1" else None
        if single is not None:
            options.notes.append(f"backward_passes_per_step={options.passes} dropped: each step() follows one "
                                 f"backward() (line {single}), and Horovod averaged at step() then anyway")
            options.passes = "1"
        elif not reevaluable(kw["backward_passes_per_step"].value):
            return _Options(f"backward_passes_per_step={options.passes} is not a literal, name, attribute or "
                            "subscript by a literal; "
                            "DDP needs `with ddp_model.no_sync():` around all but the last backward() of every group")
    if "op" in kw:
        choice = _choice(call, "op", facts, ctx)
        value = kw["op"].value
        if not isinstance(choice, dataflow.Choice) and ctx.shared.all_native and reevaluable(value) and not (
                isinstance(value, cst.Integer) or isinstance(value, cst.Name) and value.value in ("None", "True", "False")):
            # a value from elsewhere (a parameter, an attribute): every Horovod reduce op of a
            # native file is its string, "average", "sum" or "adasum" for an optimizer
            op = code_of(value).strip()
            options.sum, options.adasum = f'{op} == "sum"', f'{op} == "adasum"'
            options.notes.append(f"op={op}, a value from elsewhere: a comm hook sums the gradients when it is "
                                 f'"sum" (hvd.Sum, once its caller is migrated); DDP averages them for any other op, '
                                 "Adasum included (migration_guide/differences.md)")
            choice = dataflow.Choice({}, table=True, lookup=op)
        if not isinstance(choice, dataflow.Choice):
            why = f" ({choice})" if isinstance(choice, str) else ""
            return _Options(f"op={code_of(kw['op'].value)}: not a Horovod reduce-op constant the rewriter "
                            f"can follow{why}")
        if choice.lookup is not None and len(choice.constants) > 1:
            return _Options(f"op={choice.lookup}: a reduce op chosen at run time from a table; "
                            "DDP always averages gradients")
        unknown = choice.constants - set(_OPS)
        if unknown:
            return _Options(f"op=hvd.{sorted(unknown)[0]}: DDP always averages gradients")
        if "Sum" in choice.constants:
            options.sum = _when(choice, "Sum")
            when = "" if options.sum == "True" else f" (the branch taken when {options.sum})"
            options.notes.append(f"op=hvd.Sum{when}: a comm hook sums the gradients (DDP's own averages)")
        if not choice.table:
            options.constants.update({leaf: constants.NATIVE_VALUES[c] for leaf, c in choice.leaves.items()})
        if "Adasum" in choice.constants:
            options.adasum = _when(choice, "Adasum")
            when = "" if options.adasum == "True" else f" (the branch taken when {options.adasum})"
            options.notes.append(f"op=hvd.Adasum{when} -> averaged: DDP has no Adasum (retune the learning "
                                 "rate; migration_guide/differences.md)")
    if "gradient_predivide_factor" in kw and _literal(kw["gradient_predivide_factor"].value) not in ("1", "1.0"):
        # Horovod only allows it with op=Average, where it splits the division by the world size
        # around the sum (1/f before, f/size after): the same average, so DDP's is kept.
        options.notes.append("gradient_predivide_factor dropped: with Average it only splits the "
                             "division around the sum (same average)")
    if "sparse_as_dense" in kw and _literal(kw["sparse_as_dense"].value) != "False":
        return _Options("sparse_as_dense=True: DDP reduces sparse gradients differently; decide by hand")
    if "groups" in kw or "num_groups" in kw:
        options.notes.append("groups/num_groups dropped (only fusion grouping; DDP buckets gradients itself)")
    return options


def _one_backward_per_step(call: cst.Call, facts: "_Facts") -> Optional[int]:
    """The line of the one ``backward()`` before each ``T.step()`` of the optimizer assigned to T
    (a name or attribute chain), when every step provably follows exactly one backward pass; else
    None.

    Then ``backward_passes_per_step`` changes nothing: Horovod's ``step()`` averages every
    gradient not yet averaged, so a step after a single pass averages that pass, as DDP does. The
    proof: the module's ``backward()`` calls are exactly one per ``T.step()`` site, each step a
    statement directly in a loop's or a function's body, and its backward a statement before it
    in that body, with no ``continue``, ``break`` or ``return`` between them: backward passes and
    steps then alternate.
    """
    assign = facts.parents.get(call)
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
        return None
    target = code_of(assign.targets[0].target).strip()
    steps = [node for node in facts.parents if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
             and node.func.attr.value == "step" and code_of(node.func.value).strip() == target]
    if not steps or len(re.findall(r"\.backward\(", facts.module_code)) != len(steps):
        return None
    lines = set()
    for node in steps:
        stmt = _statement_of(node, facts)
        block = facts.parents.get(stmt)
        if not (isinstance(block, cst.IndentedBlock)
                and isinstance(facts.parents.get(block), (cst.For, cst.While, cst.FunctionDef))):
            return None
        body = list(block.body)
        before = body[:body.index(stmt)]
        backward = [k for k, other in enumerate(before) if ".backward(" in code_of(other)]
        if len(backward) != 1 or not isinstance(before[backward[0]], cst.SimpleStatementLine):
            return None
        between = "".join(code_of(other) for other in before[backward[0] + 1:])
        if re.search(r"\b(?:continue|break|return)\b", between):
            return None
        lines.add(facts.positions[before[backward[0]]].start.line)
    return min(lines)


def _inner_optimizer(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The optimizer a DistributedOptimizer call wraps: its first positional argument or
    ``optimizer=``."""
    kw, pos = keyword_args(call), positional_args(call)
    return kw["optimizer"].value if "optimizer" in kw else pos[0].value if pos else None


def _model_name(call: cst.Call) -> Optional[str]:
    """``M`` from ``named_parameters=M.named_parameters()`` (keyword or 2nd positional)."""
    kw = keyword_args(call)
    pos = positional_args(call)
    value = kw["named_parameters"].value if "named_parameters" in kw else pos[1].value if len(pos) > 1 else None
    if (
        isinstance(value, cst.Call)
        and not value.args
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "named_parameters"
        and isinstance(value.func.value, cst.Name)
    ):
        return value.func.value.value
    return None


def _is_elastic_model(node: cst.CSTNode, facts: "_Facts", ctx: RewriteContext) -> bool:
    """True for the model given to ``hvd.elastic.TorchState(model, ...)`` (first argument or
    model=): elastic.py makes that state native, and its model must be the DDP-wrapped one."""
    arg = facts.parents.get(node)
    call = facts.parents.get(arg) if isinstance(arg, cst.Arg) else None
    if not (isinstance(call, cst.Call) and hvd_attr_name(call.func, ctx.hvd_aliases) == "elastic.TorchState"):
        return False
    return (arg.keyword is not None and arg.keyword.value == "model") or (
        arg.keyword is None and arg.star == "" and call.args[0] is arg)


#: Module methods that move or cast parameters: fine before DDP wraps the model, not after.
_MOVES = {"cuda", "cpu", "to", "half", "float", "double", "bfloat16", "type", "to_empty"}


def _references(scope: Scope, name: str) -> Tuple[list, list]:
    """(accesses, assignments) of the binding `name` visible from `scope`."""
    assignments = [a for a in scope[name] if hasattr(a, "node")]
    accesses: Dict[int, object] = {}
    for assignment in assignments:
        for access in assignment.references:
            accesses[id(access.node)] = access
    return list(accesses.values()), assignments


def _passed_harmlessly(node: cst.CSTNode, facts: _Facts, seen: Tuple[cst.FunctionDef, ...] = ()) -> bool:
    """`node`, a use of the model as a value, is an argument that runs no forward pass: of
    `torch.save(...)` (DDP leaves the module it wraps picklable), or of a function defined once in this
    file whose parameter is only read for attributes other than `forward` and the moves, saved, or
    passed on to such a function in turn. E.g. `save_checkpoint(model, args)`."""
    arg, call = facts.parents.get(node), facts.parents.get(facts.parents.get(node))
    if not (isinstance(arg, cst.Arg) and arg.value is node and arg.star == "" and isinstance(call, cst.Call)):
        return False
    if _literal(call.func) == "torch.save":
        return True
    scope = facts.scopes.get(call)
    if not isinstance(call.func, cst.Name) or scope is None:
        return False
    defs = [a.node for a in scope[call.func.value] if hasattr(a, "node")]
    if len(defs) != 1 or not isinstance(defs[0], cst.FunctionDef) or defs[0] in seen:
        return False
    fn = defs[0]
    if arg.keyword is None:
        index = [a for a in call.args if a.keyword is None].index(arg)
        params = fn.params.params
        param = params[index] if index < len(params) else None
    else:
        named = [p for p in (*fn.params.params, *fn.params.kwonly_params) if p.name.value == arg.keyword.value]
        param = named[0] if named else None
    inner = facts.scopes.get(param.name) if param is not None else None
    if inner is None:
        return False
    accesses, assignments = _references(inner, param.name.value)
    if [a.node for a in assignments] != [param]:
        return False
    for access in accesses:
        parent = facts.parents.get(access.node)
        if isinstance(parent, cst.Attribute) and parent.value is access.node:
            if parent.attr.value == "forward" or parent.attr.value in _MOVES:
                return False
        elif not _passed_harmlessly(access.node, facts, (*seen, fn)):
            return False
    return True


def _mentions(stmt: cst.CSTNode, model: str) -> bool:
    text = code_of(stmt)
    return bool(re.search(rf"\b({re.escape(model)}|rank|get_rank|local_rank)\b", text))


def _redundant_broadcasts(
    stmt: cst.SimpleStatementLine, model: str, facts: _Facts, ctx: RewriteContext
) -> List[cst.SimpleStatementLine]:
    """``hvd.broadcast_parameters(M.state_dict()|M.named_parameters(), root_rank=0)`` statements
    in the same block as the wrap, with nothing between them that touches ``M`` or mentions a rank."""
    block = facts.parents.get(stmt)
    body: Sequence[cst.CSTNode] = getattr(block, "body", ())
    if stmt not in body:
        return []
    body = list(body)
    here = body.index(stmt)
    found = []
    for i, other in enumerate(body):
        if not (isinstance(other, cst.SimpleStatementLine) and len(other.body) == 1):
            continue
        expr = other.body[0]
        if not (isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call)):
            continue
        call = expr.value
        if hvd_attr_name(call.func, ctx.hvd_aliases) != "broadcast_parameters":
            continue
        pos, kw = positional_args(call), keyword_args(call)
        if has_star_args(call) or not pos or set(kw) - {"root_rank"}:
            continue
        root = kw["root_rank"].value if "root_rank" in kw else pos[1].value if len(pos) > 1 else None
        target = pos[0].value
        if _literal(root) != "0" or _literal(target) not in (f"{model}.state_dict()", f"{model}.named_parameters()"):
            continue
        lo, hi = sorted((i, here))
        between = [s for s in body[lo + 1 : hi] if s is not stmt and s is not other]
        if any(_mentions(s, model) for s in between):
            continue
        found.append(other)
    return found


def _plan_one(stmt: cst.SimpleStatementLine, call: cst.Call, facts: _Facts, ctx: RewriteContext,
              plan: OptimizerPlan, not_in_place: Optional[str] = None) -> Optional[str]:
    """Plan the rewrite of one DistributedOptimizer statement; the reason when it cannot be done.
    `not_in_place`: why the in-place rewrite failed, given on the second try, where a parameter
    the rewriter cannot prove gets a gradient every step is left to find_unused_parameters=True."""
    assign = stmt.body[0]
    assert isinstance(assign, cst.Assign)
    target = assign.targets[0].target
    if not isinstance(target, cst.Name):
        return "the optimizer must be assigned to a plain name"
    pos = positional_args(call)
    given = len(pos) + ("optimizer" in keyword_args(call))
    if has_star_args(call) or not 1 <= given <= 2:
        return "arguments not understood (expected the optimizer and named_parameters=)"
    model = _model_name(call)
    if model is None:
        return (
            "cannot tell which model this optimizer trains: pass "
            "named_parameters=model.named_parameters() or wrap the model in DDP by hand"
        )
    options = _check_options(call, ctx, facts)
    if options.error:
        return options.error
    passes, notes = options.passes, options.notes
    scope = facts.scopes.get(call)
    if scope is None:
        return "could not resolve the scope of this statement"
    if isinstance(scope, GlobalScope) and model in facts.names_elsewhere:
        return f"`{model}` is also used in another notebook cell, which the rewriter cannot follow"
    node: cst.CSTNode = stmt
    while node in facts.parents and not isinstance(node, (cst.FunctionDef, cst.Module)):
        node = facts.parents[node]
        if isinstance(node, (cst.For, cst.While)):
            return "the optimizer is wrapped inside a loop; calls before it in the loop body could not be redirected"
    here = _start(facts, stmt)
    accesses, assignments = _references(scope, model)
    if not assignments:
        # e.g. a notebook cell using a model created in another cell: its uses cannot be followed.
        return f"`{model}` is not bound in this file or cell, so its uses cannot be followed"
    for assignment in assignments:
        if assignment.scope is not scope:
            return (
                f"`{model}` is bound outside the scope of this statement; the rewriter cannot "
                "follow every use of the model"
            )
        if _start(facts, assignment.node) > here:
            return (
                f"`{model}` is re-bound at line {facts.positions[assignment.node].start.line}; "
                "the rewriter cannot follow which module DDP must wrap"
            )
    renames: Dict[cst.Name, str] = {}
    ddp_name = f"ddp_{model}"
    for access in accesses:
        node = access.node
        if _inside(facts, node, stmt):
            continue
        if access.scope is scope and _start(facts, node) < here:
            continue
        line = facts.positions[node].start.line
        parent = facts.parents.get(node)
        if isinstance(parent, cst.Call) and parent.func is node or _is_elastic_model(node, facts, ctx):
            renames[node] = ddp_name
        elif isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value == "forward":
                return f"`{model}.forward(...)` at line {line} would bypass DistributedDataParallel"
            if parent.attr.value in _MOVES:
                return (
                    f"`{model}.{parent.attr.value}(...)` at line {line} moves or casts the model after "
                    "the wrap; DDP must wrap it on its final device and dtype (move that call before it)"
                )
        elif not _passed_harmlessly(node, facts):
            return (
                f"`{model}` is used as a value at line {line} (e.g. passed to a function); the "
                "rewriter cannot prove every forward pass then goes through DistributedDataParallel"
            )
    values = []
    for assignment in assignments:
        bound = facts.parents.get(facts.parents.get(assignment.node))
        if not isinstance(bound, cst.Assign):
            return f"`{model}` is bound by something other than `{model} = ...`"
        values.append(bound.value)
    forward_calls = [facts.parents[n] for n in renames
                     if isinstance(facts.parents.get(n), cst.Call) and facts.parents[n].func is n]
    unproven = parameter_use.every_parameter_used(
        model, values, forward_calls, {c: facts.positions[c].start.line for c in forward_calls},
        facts.module_code)
    if unproven and not_in_place is None:
        return unproven
    join = _plan_join(stmt, forward_calls, facts, ctx) if ctx.shared.calls_join else None
    if isinstance(join, str):
        barriers = _plan_barriers(facts, ctx)
        if isinstance(barriers, str):
            return join
        join = barriers
    reads = _reads_to_name(facts, _has_synchronize(scope, target.value, facts), f"`{target.value}.synchronize()`")
    if isinstance(reads, str):
        return reads
    accumulation = None
    if passes != "1":
        forward_calls = [n for n in renames if getattr(facts.parents.get(n), "func", None) is n]
        accumulation = plan_accumulation(passes, target.value, forward_calls, facts.parents)
        if isinstance(accumulation, str):
            return accumulation
    ddp_name = free_name(ddp_name, facts.names_in_module)
    renames = {node: ddp_name for node in renames}
    if accumulation is not None:
        plan.accumulate[accumulation.loop] = (accumulation, ddp_name)
        ctx.need(HVD, "contextlib")
        notes.append(f"backward_passes_per_step={passes} -> no_sync() on the other backward passes")

    lines = _before_the_wrap(call, stmt, options, facts, ctx)
    # Horovod synced buffers (BatchNorm statistics) once, with broadcast_parameters, and never again;
    # DDP's default re-broadcasts rank 0's at every forward. forward_sync_buffers=False keeps the
    # sync at construction only, as Horovod did (so per-rank evaluation gives the same metrics).
    # A torch without it (torch_api.py) gets broadcast_buffers=False, which syncs no buffer at
    # all: the program's own broadcast of the state_dict then stays, for the one sync.
    sync_once = torch_api.has("DDP.forward_sync_buffers")
    buffers = "forward_sync_buffers=False" if sync_once else "broadcast_buffers=False"
    adasum = options.adasum_comment()
    group = f", process_group={options.process_group}" if options.process_group else ""
    unused = ", find_unused_parameters=True" if unproven else ""
    comment = "; ".join(([inplace.UNUSED_COMMENT] if unproven else []) + ([adasum] if adasum else []))
    lines.append(f"{ddp_name} = DDP({model}, {buffers}{unused}{group})" + (f"  # {comment}" if comment else "") + "\n")
    ctx.need(HVD, "DDP")
    lines += options.comm_hook_lines(ddp_name, ctx, f"{ddp_name}.process_group" if group else None)
    statements = [cst.parse_statement(line) for line in lines]
    statements[0] = statements[0].with_changes(leading_lines=stmt.leading_lines)
    note = f"-> {ddp_name} = DDP({model}, {buffers}{unused}); forward calls of `{model}` now go through {ddp_name}"
    if unproven:
        note += (f"; find_unused_parameters=True, since {unproven}; so a parameter no rank used in a step keeps "
                 f"grad None where Horovod averaged zeros (not made in place: {not_in_place})")
    if options.fp16 != "False":
        note += "; fp16 compression -> fp16_compress_hook"
        if options.fp16 != "True":
            note += f" when {options.fp16 or options.hook_name + ' is not None'}"
    if notes:
        note += "; " + "; ".join(notes)
    note += _name_reads(reads, plan, [model])
    if join is not None:
        note += "; " + join.apply(ddp_name, plan, ctx)
    plan.constants.update(options.constants)
    plan.replace[stmt] = Rewritten(statements, note)
    plan.rename.update(renames)
    # (on a process set, DDP broadcasts from the set's first rank, not from global rank 0)
    for other in _redundant_broadcasts(stmt, model, facts, ctx) if sync_once and not options.process_group else ():
        plan.remove[other] = "removed: DDP broadcasts parameters and buffers from rank 0 when it wraps the model"
    _plan_optimizer_uses(scope, target.value, facts, plan)
    return None




@dataclasses.dataclass
class _Join:
    """``hvd.join()`` right after the training loop that the wrapped model's forward passes run
    in: the loop goes under DDP's ``Join`` context manager, which does what Horovod's join did for
    the gradients (a rank out of data stands in with zeros, and the average still divides by the
    whole world size: Join's default ``divide_by_initial_world_size=True``)."""

    loop: cst.CSTNode
    statement: cst.SimpleStatementLine
    #: the name ``hvd.join()``'s value is assigned to, if it is
    target: Optional[str]

    def apply(self, ddp_name: str, plan: OptimizerPlan, ctx: RewriteContext) -> str:
        """Plan the rewrite; the report's words for it."""
        plan.join_loops[self.loop] = ddp_name
        ctx.need(HVD, "Join")
        ctx.shared.calls_join = False  # no rank is left out of a collective after the Join block
        done = "hvd.join() -> `with Join([%s]):` around the training loop before it" % ddp_name
        if self.target is None:
            plan.remove[self.statement] = "removed: " + done
            return done
        plan.substitute[self.statement] = Rewritten(
            [cst.parse_statement(f"{self.target} = -1  # {JOIN_VALUE}\n")],
            f"-> {self.target} = -1: {JOIN_VALUE}")
        return done + f" ({self.target} = -1: {JOIN_VALUE})"


#: The difference named where ``x = hvd.join()`` was.
JOIN_VALUE = "DDP's Join does not tell which rank joined last (Horovod's hvd.join() returned it)"
#: The difference named where an ``hvd.join()`` whose loop this file does not show was.
JOIN_BARRIER = ("was hvd.join(): assumes every rank ran as many steps (DDP needs that; Horovod's "
                "join let a rank out of data stand in with zeros)")


#: Why no Join or barrier: the file has none of the program's hvd.join() calls.
_JOIN_ELSEWHERE = ("hvd.join() is called in another cell or file, whose loop DDP's Join context manager "
                   "would have to cover")


def _statement_before(statement: cst.CSTNode, facts: _Facts) -> Optional[cst.CSTNode]:
    """The statement right before `statement` in its block, or None where it comes first."""
    block = list(getattr(facts.parents.get(statement), "body", ()))
    at = next((i for i, node in enumerate(block) if node is statement), 0)
    return block[at - 1] if at > 0 else None


@dataclasses.dataclass
class _Barriers:
    """The ``hvd.join()`` statements of a file that does not show the loops they end (the loop is
    a base class's, or the join is a framework's "wait for everyone"): each becomes
    ``dist.barrier()``, the difference named at its line. DDP's Join would have to go around a
    loop this file cannot reach, so the rewrite assumes what DDP needs anyway: every rank runs the
    same number of steps. Then the ranks meet there and nothing else changes."""

    statements: List[cst.SimpleStatementLine]

    def apply(self, ddp_name: str, plan: OptimizerPlan, ctx: RewriteContext) -> str:
        """Plan the rewrite; the report's words for it."""
        ctx.need(HVD, "dist")
        ctx.shared.calls_join = False  # no rank stands in for another: native collectives need no announce
        for statement in self.statements:
            plan.substitute[statement] = Rewritten(
                [cst.parse_statement(f"dist.barrier()  # {JOIN_BARRIER}\n")], f"-> dist.barrier(): {JOIN_BARRIER}")
        return f"hvd.join() -> dist.barrier() ({JOIN_BARRIER})"


def _plan_barriers(facts: _Facts, ctx: RewriteContext) -> Union[_Barriers, str]:
    """The program's ``hvd.join()`` calls as `_Barriers`, where none of them ends a loop this file
    shows that runs a collective; else why not. Each must be a statement of its own whose value is
    not used; the loops its function runs before it, and those of the functions of this file that
    the statement before it calls, must run no collective and no ``backward()`` (such a loop goes
    under DDP's Join, `_plan_join`, or keeps its TODO: a barrier would hang a rank that has more
    data). A loop without one (features written to a file per rank, ffvqgan's) leaves no rank
    waiting in a collective, so the barrier waits as the join did."""
    calls = [node for node in facts.parents if isinstance(node, cst.Call)]
    joins = [c for c in calls if hvd_attr_name(c.func, ctx.hvd_aliases) == "join"]
    if not joins:
        return _JOIN_ELSEWHERE
    statements = []
    join_statements = [facts.parents.get(facts.parents.get(join)) for join in joins]
    for join in joins:
        line = facts.positions[join].start.line
        holder = facts.parents.get(join)
        statement = facts.parents.get(holder)
        if not (isinstance(holder, cst.Expr) and isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1) or has_star_args(join) or len(join.args) > 1:
            return f"hvd.join() at line {line} is not a statement of its own whose value goes unused"
        function = _function_of(statement, facts)
        every_loop = [node for node in facts.parents if isinstance(node, (cst.For, cst.While))]
        loops = [node for node in every_loop
                 if _function_of(node, facts) is function and _start(facts, node) < _start(facts, statement)]
        before = _statement_before(statement, facts)
        running = _functions_run(before, calls, facts) if before is not None else []
        # A loop with a join among its own statements (an epoch loop) runs as many passes on every
        # rank: under Horovod a rank with one more pass would wait in its join forever. So its
        # own collectives run on every rank alike; what may not is what it runs in its inner
        # loops and in the functions it calls, wherever they stand in its body.
        paced = [loop for loop in loops if any(s in getattr(loop.body, "body", ()) for s in join_statements)]
        loops = [loop for loop in loops if loop not in paced]
        for outer in paced:
            loops += [n for n in every_loop if n not in paced and n not in loops and _inside(facts, n, outer)]
            running += [f for f in _functions_run(outer, calls, facts) if f not in running]
        loops += [n for f in running for n in facts.parents
                  if isinstance(n, (cst.For, cst.While)) and _function_of(n, facts) is f]
        for loop in loops:
            collective = _collective_in(loop, f"the loop at line {facts.positions[loop].start.line}", calls, facts, ctx, True)
            if collective:
                return (f"hvd.join() at line {line} ends a loop of this file that is not the wrapped "
                        f"model's training loop right before it ({collective}; DDP's Join context "
                        "manager must go around that loop)")
        statements.append(statement)
    return _Barriers(statements)


def _plan_join(wrap: cst.SimpleStatementLine, forward_calls: Sequence[cst.Call], facts: _Facts,
               ctx: RewriteContext) -> Union[_Join, str]:
    """The ``hvd.join()`` of a program whose DistributedOptimizer becomes a DDP wrap, as a
    `_Join`; or why DDP's Join cannot take its place. It can where the file has one
    DistributedOptimizer and one ``hvd.join()``, a statement of its own right after a loop (in
    the wrap's function, after the wrap) that runs the model's forward passes and no other
    collective: Join shadows DDP's own gradient averaging only, so a collective of the program's
    in the loop would wait forever for the ranks that joined."""
    calls = [node for node in facts.parents if isinstance(node, cst.Call)]
    joins = [c for c in calls if hvd_attr_name(c.func, ctx.hvd_aliases) == "join"]
    optimizers = [c for c in calls if hvd_attr_name(c.func, ctx.hvd_aliases) == "DistributedOptimizer"]
    if not joins:
        return _JOIN_ELSEWHERE
    if len(joins) > 1 or len(optimizers) > 1:
        return ("the program calls hvd.join() more than once or has several DistributedOptimizers "
                "(DDP's Join context manager would have to cover each model's loop)")
    join = joins[0]
    line = facts.positions[join].start.line
    holder = facts.parents.get(join)
    statement = facts.parents.get(holder)
    target = None
    if isinstance(holder, cst.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0].target, cst.Name):
        target = holder.targets[0].target.value
    elif not isinstance(holder, cst.Expr):
        statement = None
    if join.args or not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return (f"hvd.join() at line {line} is not a statement of its own without arguments, which "
                "DDP's Join context manager around the training loop could replace")
    loop = _statement_before(statement, facts)
    if not isinstance(loop, (cst.For, cst.While)) or loop.orelse is not None \
            or isinstance(loop, cst.For) and loop.asynchronous is not None:
        return (f"hvd.join() at line {line} does not follow the training loop it ends (DDP's Join "
                "context manager goes around that loop)")
    if _function_of(loop, facts) is not _function_of(wrap, facts) or _start(facts, loop) < _start(facts, wrap):
        return f"the loop that hvd.join() at line {line} ends is not after the wrap in its function"
    if not any(_inside(facts, call, loop) for call in forward_calls):
        return f"the loop that hvd.join() at line {line} ends runs no forward pass of the model"
    collective = _collective_in(loop, "the loop that hvd.join() ends", calls, facts, ctx, backward=False)
    if collective:
        return (f"{collective}: DDP's Join stands in for DDP's gradient averaging only, so the ranks still "
                "in the loop would wait for the joined ones there")
    return _Join(loop, statement, target)


def _collective_in(loop: cst.CSTNode, what: str, calls: Sequence[cst.Call], facts: _Facts,
                   ctx: RewriteContext, backward: bool) -> Optional[str]:
    """The first collective that `loop` (called `what`) runs, in its own code or, transitively, in
    the functions of this file it calls: a Horovod collective, torch.distributed, and with
    `backward` a ``backward()`` (a data-parallel model's averaging); None where it runs none."""
    for node in [loop, *_functions_run(loop, calls, facts)]:
        where = f"in {what}" if node is loop else f"in {node.name.value}(), which {what} calls"
        for call in calls:
            name = hvd_attr_name(call.func, ctx.hvd_aliases)
            if name is not None and _COLLECTIVE.match(name) and _inside(facts, call, node):
                return f"hvd.{name}() at line {facts.positions[call].start.line} runs {where}"
        code = "\n".join(facts.module_code.splitlines()[
            facts.positions[node].start.line - 1:facts.positions[node].end.line])
        if re.search(r"\bdist\.|torch\.distributed\b", code):
            return f"torch.distributed is called {where}"
        if backward and re.search(r"\bbackward\(", code):
            return f"backward() runs {where}"
    return None


def _functions_run(node: cst.CSTNode, calls: Sequence[cst.Call], facts: _Facts) -> List[cst.FunctionDef]:
    """The functions of this file that `node` calls (by name or as a method of that name: every
    function of that name, an override and what it overrides alike), and those they call in turn."""
    functions: Dict[str, List[cst.FunctionDef]] = {}
    for function in facts.parents:
        if isinstance(function, cst.FunctionDef):
            functions.setdefault(function.name.value, []).append(function)
    running: List[cst.FunctionDef] = []
    todo = [node]
    while todo:
        caller = todo.pop()
        for call in calls:
            func = call.func.attr if isinstance(call.func, cst.Attribute) else call.func
            for callee in functions.get(func.value, ()) if isinstance(func, cst.Name) else ():
                if callee not in running and _inside(facts, call, caller):
                    running.append(callee)
                    todo.append(callee)
    return running


#: Horovod calls that wait for the other ranks (rank(), size() and the like do not).
_COLLECTIVE = re.compile(r"(?:grouped_)?(?:allreduce|allgather|broadcast|alltoall|reducescatter)|barrier$|"
                         r"join$|synchronize$|poll$|elastic\.")


def _function_of(node: cst.CSTNode, facts: _Facts) -> Optional[cst.CSTNode]:
    """The function `node` is in, else its module."""
    while node in facts.parents and not isinstance(node, (cst.FunctionDef, cst.Module)):
        node = facts.parents[node]
    return node


def _before_the_wrap(call: cst.Call, stmt: cst.CSTNode, options: _Options, facts: _Facts,
                     ctx: RewriteContext) -> List[str]:
    """The lines either rewrite (DDP wrap or in place) puts first: the inner optimizer's state
    cleared where it had one, and Horovod's check that named_parameters names every parameter of
    the optimizer where a group was added to it."""
    lines = []
    inner = _inner_optimizer(call)
    if not isinstance(inner, cst.Name) or stmt is None:
        return lines
    before = _before(inner.value, stmt, facts)
    if re.search(rf"broadcast_optimizer_state\(\s*{re.escape(inner.value)}\b|\b{re.escape(inner.value)}\."
                 r"(?:load_state_dict|step)\(", before):
        # Horovod's wrapper was a new optimizer over the same parameter groups, without the state
        lines.append(f"{inner.value}.state.clear()  # as under Horovod: the wrap started without state\n")
        options.notes.append(f"`{inner.value}` had state before the wrap, which Horovod's wrapper did not keep: cleared")
    named = keyword_args(call).get("named_parameters")
    value = named.value if named is not None else None
    if re.search(rf"\b{re.escape(inner.value)}\.add_param_group\(", before) and isinstance(value, cst.Call) \
            and not value.args and isinstance(value.func, cst.Attribute) and value.func.attr.value == "named_parameters":
        # a group added to the optimizer may hold parameters outside the named module, which
        # Horovod refused at the wrap, and which the native wrap would leave unaveraged
        module = code_of(value.func.value).strip()
        lines.append(_UNNAMED_CHECK.format(optimizer=inner.value, module=module))
        options.notes.append(f"`{inner.value}.add_param_group(...)` before the wrap: a check stops the program, as "
                             f"Horovod did, where a parameter of the optimizer is not one of `{module}`'s")
    return lines


#: Horovod's wrap raised this ValueError where the optimizer held a parameter named_parameters did not name.
_UNNAMED_CHECK = (
    "if {{id(p) for group in {optimizer}.param_groups for p in group[\"params\"]}} - {{id(p) for p in {module}.parameters()}}:"
    "  # as Horovod's DistributedOptimizer checked\n"
    "    raise ValueError(\"named_parameters was specified, but one or more model parameters were not named\")\n")


#: Constructors of a new optimizer, without state: torch's (``torch.optim.SGD``, ``optim.Adam``) or
#: a class of the program's (a capitalized name).
_FRESH_OPTIMIZER = re.compile(r"^(?:(?:torch\.)?optim\.)?[A-Z]\w*$")


def _before(name: str, stmt: cst.CSTNode, facts: _Facts) -> str:
    """The code that may act on optimizer `name` before the wrap at `stmt` (to find a state
    broadcast, a load or a step that gave it state, or a group added to it): the earlier lines of
    the function that wraps it where `name` is a local name of that function, else of the module;
    after the last line that binds `name` to a new optimizer, where one does."""
    function = _function_of(stmt, facts)
    scope = facts.scopes.get(stmt)
    local = scope is not None and isinstance(function, cst.FunctionDef) and bool(scope[name]) and all(
        a.scope is scope for a in scope[name])
    first = facts.positions[function].start.line if local else 1
    here = facts.positions[stmt].start.line
    for assignment in scope[name] if scope is not None else ():
        # (a fresh optimizer bound to the name since: `optimizer = torch.optim.SGD(...)`)
        line = facts.positions[assignment.node].start.line if assignment.node in facts.positions else 0
        bound = facts.parents.get(facts.parents.get(assignment.node))
        if first <= line < here and isinstance(bound, cst.Assign) and isinstance(bound.value, cst.Call) \
                and _FRESH_OPTIMIZER.match(code_of(bound.value.func).strip()):
            first = line + 1
    return "\n".join(facts.module_code.splitlines()[first - 1:here - 1])


#: The comment above a statement that reads gradients after backward() and before step().
_READ_COMMENT = "# DDP: the gradients are averaged here already (Horovod, without synchronize(): not yet)"
#: The comment above a gradient read the rewriter cannot place before or after a step().
_UNPLACED_COMMENT = "# DDP: gradients are averaged once backward() returns (Horovod: in step() or synchronize())"


def _reads_to_name(facts: _Facts, synchronized: bool, sync: str) -> Union[str, List[Read]]:
    """The gradient reads that may sit between a backward() and its step(), whose difference the
    rewrite names at their lines (gradient_reads.py), or why it cannot go ahead: a read outside any
    statement, where no comment can go. A program that calls `sync` (the optimizer's
    synchronize()) reads averaged gradients under Horovod as under DDP."""
    if synchronized:
        return []
    reads = [read for read in facts.gradient_reads if read.where is not Where.AFTER_STEP]
    bare = [read for read in reads if read.statement is None]
    if bare:
        return (f"{GRADIENTS_READ} (`{bare[0].text}` at line {bare[0].line}) outside a statement the "
                f"rewriter can comment, and {sync} is never called (call synchronize() first, as "
                "Horovod's docs advise; --emulate keeps Horovod's order)")
    return reads


def _name_reads(reads: List[Read], plan: OptimizerPlan, models: Sequence[str]) -> str:
    """Plan the comment above each read of `reads` (but a clip of a module other than `models`,
    which this wrap leaves alone); the report's words for them. A read the rewriter cannot place
    sees, under DDP, the averaged gradients wherever it runs after a backward(); under Horovod,
    before step() it raced the averaging, after it saw the same."""
    reads = [read for read in reads if read.module is None or read.module in models]
    for read in reads:
        plan.comments[read.statement] = _READ_COMMENT if read.where is Where.BETWEEN else _UNPLACED_COMMENT
    between = ", ".join(str(line) for line in sorted({r.line for r in reads if r.where is Where.BETWEEN}))
    unplaced = ", ".join(str(line) for line in sorted({r.line for r in reads if r.where is Where.UNPROVEN}))
    note = ""
    if between:
        note += (f"; gradients read after backward() and before step() without synchronize() (line {between}): "
                 "under DDP they are averaged there, as Horovod's docs ask (synchronize() first); under "
                 "Horovod the read raced the averaging (named at the line)")
    if unplaced:
        note += (f"; gradients read where the rewriter cannot tell whether before or after step() (line "
                 f"{unplaced}): under DDP averaged once backward() returns; under Horovod the same after "
                 "step(), still in flight before it without synchronize() (named at the line)")
    return note


def _has_synchronize(scope: Scope, name: str, facts: _Facts) -> bool:
    plan = OptimizerPlan()
    _plan_optimizer_uses(scope, name, facts, plan)
    return bool(plan.remove) or bool(plan.unwrap)


def _plan_optimizer_uses(scope: Scope, name: str, facts: _Facts, plan: OptimizerPlan) -> None:
    """Drop ``opt.synchronize()`` statements and unwrap ``with opt.skip_synchronize():`` blocks."""
    accesses, _ = _references(scope, name)
    for access in accesses:
        attr = facts.parents.get(access.node)
        if not (isinstance(attr, cst.Attribute) and attr.value is access.node):
            continue
        call = facts.parents.get(attr)
        if isinstance(call, cst.Call) and call.func is attr and not call.args:
            _drop_sync(call, facts, plan)


def _drop_sync(call: cst.Call, facts: _Facts, plan: OptimizerPlan) -> bool:
    """Plan the removal of ``opt.synchronize()`` as a statement of its own, or the unwrapping of
    ``with opt.skip_synchronize():`` (`call` is either call); False when it is used otherwise."""
    holder = facts.parents.get(call)
    outer = facts.parents.get(holder)
    if call.func.attr.value == "synchronize" and isinstance(holder, cst.Expr) \
            and isinstance(outer, cst.SimpleStatementLine) and len(outer.body) == 1:
        plan.remove[outer] = "removed: DDP has already averaged the gradients after backward()"
        return True
    if call.func.attr.value == "skip_synchronize" and isinstance(holder, cst.WithItem) \
            and isinstance(outer, cst.With) and len(outer.items) == 1 and holder.asname is None:
        plan.unwrap.add(outer)
        return True
    return False


def plan_optimizers(
    module: cst.Module,
    positions: Mapping[cst.CSTNode, CodeRange],
    scopes: Mapping[cst.CSTNode, Optional[Scope]],
    parents: Mapping[cst.CSTNode, cst.CSTNode],
    ctx: RewriteContext,
    names: Set[str],
    names_elsewhere: Set[str],
) -> OptimizerPlan:
    """Find every ``hvd.DistributedOptimizer`` call and plan its rewrite or its TODO. `names`:
    every name `module` uses (the caller has them: each walk of the tree costs)."""
    finder = _FindOptimizers(ctx.hvd_aliases)
    module.visit(finder)
    plan = OptimizerPlan()
    facts = _Facts(positions, scopes, parents, names, names_elsewhere, without_comments(module.code))
    replicated: Dict[str, Tuple[cst.SimpleStatementLine, bool]] = {}
    #: (scope, model) of each wrap: a model wrapped twice in one scope is one module
    wrapped = [(scopes.get(call), _model_name(call)) for call in finder.calls]
    for call in finder.calls:
        assign = parents.get(call)
        stmt = parents.get(assign) if assign is not None else None
        model = _model_name(call)
        planned = False
        if model is not None and wrapped.count((scopes.get(call), model)) > 1:
            # (each wrap would redirect the forward calls to its own DDP module)
            reason = f"`{model}` is under more than one DistributedOptimizer; DDP wraps a module once"
        elif not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
        ):
            reason = "it is not `opt = hvd.DistributedOptimizer(...)` as a statement of its own"
        else:
            reason, planned = _plan_one(stmt, call, facts, ctx, plan), True
        if reason is None:
            continue
        why_not = _plan_in_place(call, facts, ctx, plan, replicated, len(finder.calls) == 1)
        if why_not is not None and planned and _plan_one(stmt, call, facts, ctx, plan, not_in_place=why_not) is None:
            continue  # (DDP with find_unused_parameters=True: only the parameters' use was unproven)
        if why_not is not None:
            plan.flagged[call] = reason if why_not == reason else f"{reason}; not in place either: {why_not}"
    return plan


def _plan_in_place(call: cst.Call, facts: _Facts, ctx: RewriteContext, plan: OptimizerPlan,
                   replicated: Dict[str, Tuple[cst.SimpleStatementLine, bool]], only_one: bool) -> Optional[str]:
    """Plan `call` as a model made data-parallel in place (inplace.py); the reason when it cannot."""
    options = _check_options(call, ctx, facts)
    if options.error:
        return options.error
    barriers = _plan_barriers(facts, ctx) if ctx.shared.calls_join else None
    if isinstance(barriers, str):
        return f"the program calls hvd.join(), which only a DDP wrap can take (with DDP's Join): {barriers}"
    uses = _optimizer_uses_by_text(call, facts, only_one)
    if isinstance(uses, str):
        return uses
    reads = _reads_to_name(facts, bool(uses.remove), "the optimizer's synchronize()")
    if isinstance(reads, str):
        return reads
    first = _before_the_wrap(call, _statement_of(call, facts), options, facts, ctx)
    outcome = inplace.plan(call, facts, ctx, options, replicated, first)
    if isinstance(outcome, str):
        return outcome
    note = outcome.note + _name_reads(reads, plan, outcome.models)
    if barriers is not None:
        note += "; " + barriers.apply("", plan, ctx)
    plan.inplace[call] = dataclasses.replace(outcome, note=note)
    plan.forwards.update(outcome.forwards)
    for statement in outcome.forwards.values():
        plan.comments.setdefault(statement, inplace.FORWARD_COMMENT)
    plan.constants.update(options.constants)
    plan.remove.update(uses.remove)
    plan.unwrap.update(uses.unwrap)
    return None


def _statement_of(node: cst.CSTNode, facts: _Facts) -> Optional[cst.SimpleStatementLine]:
    while node is not None and not isinstance(node, cst.SimpleStatementLine):
        node = facts.parents.get(node)
    return node


#: Receivers of `.synchronize()` that are not a Horovod optimizer.
_DEVICE_SYNC = re.compile(r"^(?:torch\.)?(?:cuda|mps|xpu|xm|torch_xla\.\w+)$|\.(?:cuda|mps|xpu)$")


def _returned_to(target: Optional[str], assign: Optional[cst.CSTNode], facts: _Facts) -> Set[str]:
    """The names bound to what the function around the wrap returns, when it returns the wrapped
    optimizer (``return optimizer`` in ``def create_optimizer(self)``, then ``bert_optimizer =
    self.create_optimizer(...)``, nlp-recipes' form): that optimizer under another name."""
    function = _function_of(assign, facts) if assign is not None else None
    if target is None or not isinstance(function, cst.FunctionDef):
        return set()
    returns = [n for n in facts.parents if isinstance(n, cst.Return) and n.value is not None
               and _function_of(n, facts) is function]
    if not returns or any(code_of(n.value).strip() != target for n in returns):
        return set()
    name = function.name.value
    return {code_of(n.targets[0].target).strip() for n in facts.parents
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call)
            and (isinstance(n.value.func, cst.Name) and n.value.func.value == name
                 or isinstance(n.value.func, cst.Attribute) and n.value.func.attr.value == name)}


def _optimizer_uses_by_text(call: cst.Call, facts: _Facts, only_one: bool) -> Union["OptimizerPlan", str]:
    """The ``T.synchronize()`` statements to drop and ``with T.skip_synchronize():`` blocks to
    unwrap, where T is the target the wrapped optimizer is assigned to (a name or attribute
    chain); or why some call of them cannot be told to be this optimizer's (a plain torch
    optimizer has neither method, so none may stay). When the file has `only_one`
    DistributedOptimizer, a receiver of ``skip_synchronize()`` (only Horovod's optimizer has that
    method) is this optimizer under another name (``optimizer = self.create_optimizer()``), and so
    are its ``synchronize()`` calls."""
    assign = facts.parents.get(call)
    target = code_of(assign.targets[0].target).strip() \
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
    calls = [node for node in facts.parents
             if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and not node.args
             and node.func.attr.value in ("synchronize", "skip_synchronize")]
    names = {target} | ({code_of(node.func.value).strip() for node in calls
                         if node.func.attr.value == "skip_synchronize"} | _returned_to(target, assign, facts)
                        if only_one else set())
    found = OptimizerPlan()
    for node in calls:
        receiver = code_of(node.func.value).strip()
        if node.func.attr.value == "synchronize" and _DEVICE_SYNC.search(receiver):
            continue
        line = facts.positions[node].start.line
        if receiver not in names:
            return (f"`{receiver}.{node.func.attr.value}()` at line {line} may be this optimizer's, which "
                    "the rewriter cannot tell")
        if not _drop_sync(node, facts, found):
            return f"`{receiver}.{node.func.attr.value}()` at line {line} is used in a way the rewriter cannot drop"
    return found
