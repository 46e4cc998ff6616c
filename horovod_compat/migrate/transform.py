"""The libcst transformer that applies the rewrite rules to one module and places TODO comments.

Rules live in ``rules/``; this file only dispatches: ``hvd.X(...)`` calls go to the rule
registered for ``X``, statement-shaped rewrites (``hvd.init()``, the optimizer wrap) replace whole
statements, and anything no rule handles gets a TODO comment above its statement.  Line numbers
in findings are those of the input.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Union

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

from horovod_compat.migrate.context import HOROVOD, Flagged, Outcome, RewriteContext, Rewritten, hvd_attr_name
from horovod_compat.migrate.report import todo_comment
from horovod_compat.migrate.rules import (
    collectives, constants, elastic, flags, lightning, optimizer_hooks, probes, runner, sampler, state_sync,
    topology,
)
from horovod_compat.migrate.rules.flags import reason_for
from horovod_compat.migrate.rules.optimizer import OptimizerPlan

CallRule = Callable[[str, cst.Call, RewriteContext], Outcome]

CALL_RULES: Dict[str, CallRule] = {
    **topology.CALLS,
    **collectives.CALLS,
    **state_sync.CALLS,
    **elastic.CALLS,
}
STATEMENT_RULES = {**topology.STATEMENTS, **state_sync.STATEMENTS}

_COMPOUND = (
    cst.If, cst.For, cst.While, cst.With, cst.Try, cst.FunctionDef, cst.ClassDef, cst.ExceptHandler,
)


def _assigns_to_itself(statement: cst.SimpleStatementLine) -> bool:
    """True for ``x = x`` (``self.opt = self.opt``)."""
    if len(statement.body) != 1 or not isinstance(statement.body[0], cst.Assign):
        return False
    assign = statement.body[0]
    code = cst.Module([]).code_for_node
    return len(assign.targets) == 1 and code(assign.targets[0].target).strip() == code(assign.value).strip()


class _Frame:
    """One statement being rewritten: TODO comments to attach above it, and (a simple statement
    only) statements that a rule's rewrite of an expression in it needs before it."""

    def __init__(self, simple: bool = False) -> None:
        self.todos: List[str] = []
        #: plain comments (a difference named at the line: OptimizerPlan.comments)
        self.comments: List[str] = []
        self.simple = simple
        self.before: List[cst.BaseStatement] = []


class HorovodTransformer(cst.CSTTransformer):
    """Rewrite ``hvd.*`` uses in one module according to the rules and an optimizer plan."""

    METADATA_DEPENDENCIES = (PositionProvider, ParentNodeProvider)

    def __init__(self, ctx: RewriteContext, plan: OptimizerPlan,
                 unsupported_imports: Dict[cst.CSTNode, str]) -> None:
        super().__init__()
        self.ctx = ctx
        self.plan = plan
        self.unsupported_imports = unsupported_imports
        self.frames: List[_Frame] = []
        self.statement_calls: Dict[cst.Call, Optional[Outcome]] = {}
        self.hvd_call_depth = 0
        self.inner_attributes: set = set()
        #: the branches a probe of Horovod's API decided against (rules/probes.py): not visited
        self.dead: set = set()
        #: if statements and expressions whose test a probe decided -> its value
        self.decisions: Dict[cst.CSTNode, bool] = {}

    # -- helpers ---------------------------------------------------------------------------
    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _flag(self, node: cst.CSTNode, name: str, message: str) -> None:
        self.ctx.todo(self._line(node), name, message)
        if self.frames:
            text = todo_comment(name, message)
            if text not in self.frames[-1].todos:
                self.frames[-1].todos.append(text)

    def _with_todos(self, node: cst.CSTNode, frame: _Frame) -> cst.CSTNode:
        if not (frame.todos or frame.comments) or not hasattr(node, "leading_lines"):
            return node
        # A TODO for the same name already above the statement (a re-run) is not repeated.
        present = [line.comment.value for line in node.leading_lines if line.comment is not None]
        comments = [cst.EmptyLine(comment=cst.Comment(c)) for c in frame.comments if c not in present] + [
            cst.EmptyLine(comment=cst.Comment(t))
            for t in frame.todos
            if not any(p.startswith(t.split(": ", 2)[0] + ": " + t.split(": ", 2)[1] + ":") for p in present)
        ]
        return node.with_changes(leading_lines=[*node.leading_lines, *comments])

    def _next_pins_device(self, node: cst.SimpleStatementLine) -> bool:
        """True when a later statement of the same block already calls torch.cuda.set_device (the
        usual Horovod idiom after hvd.init()), so the rewrite need not pin the device again."""
        block = self.get_metadata(ParentNodeProvider, node, None)
        body = list(getattr(block, "body", ()))
        if node not in body:
            return False
        return any("set_device(" in cst.Module([]).code_for_node(s) for s in body[body.index(node) + 1:])

    def _kept_lifecycle(self, node: cst.SimpleStatementLine, name: str) -> bool:
        """True for an ``hvd.init()`` right after the native init block, or an ``hvd.shutdown()``
        right before the native destroy: kept there by an earlier run (Horovod uses remained),
        so a re-run leaves them as they are."""
        block = self.get_metadata(ParentNodeProvider, node, None)
        body = list(getattr(block, "body", ()))
        if node not in body:
            return False
        i = body.index(node)
        near = body[i - 1::-1] if name == "init" else body[i + 1:]
        code = cst.Module([]).code_for_node(near[0]) if near else ""
        marker = "dist.init_process_group(" if name == "init" else "dist.destroy_process_group()"
        # after the init block comes the device pinning, when the rewrite added it
        if name == "init" and "set_device(" in code and len(near) > 1:
            code = cst.Module([]).code_for_node(near[1])
        return marker in code and "is_initialized()" in code

    # -- statements --------------------------------------------------------------------------
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> Optional[bool]:
        self.frames.append(_Frame(simple=True))
        if node in self.plan.comments:
            self.frames[-1].comments.append(self.plan.comments[node])
        if node in self.plan.remove or node in self.plan.substitute:
            return False  # the whole statement goes; rewriting inside it would only add noise
        if len(node.body) == 1 and isinstance(node.body[0], cst.Expr) and isinstance(node.body[0].value, cst.Call):
            call = node.body[0].value
            name = hvd_attr_name(call.func, self.ctx.hvd_aliases)
            if name in ("init", "shutdown") and self._kept_lifecycle(node, name):
                self.statement_calls[call] = None  # stays as it is, silently
            elif name == "init":
                self.statement_calls[call] = topology.rewrite_init(
                    call, self.ctx, pin_device=not self._next_pins_device(node))
            elif name in STATEMENT_RULES:
                self.statement_calls[call] = STATEMENT_RULES[name](call, self.ctx)
        for small in node.body:
            if small in self.unsupported_imports:
                self._flag(small, "import", self.unsupported_imports[small])

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.BaseStatement, cst.FlattenSentinel, cst.RemovalSentinel]:
        frame = self.frames.pop()
        line = self._line(original_node)
        if original_node in self.plan.remove:
            self.ctx.rewrite(line, "statement", self.plan.remove[original_node])
            return cst.RemoveFromParent()
        replacement: Optional[List[cst.BaseStatement]] = None
        before = [(call, wrap) for call, wrap in self.plan.inplace.items() if wrap.statement is original_node]
        if before:  # models made data-parallel in place before the statement that wraps their optimizer
            replacement = [cst.parse_statement(text) for _, wrap in before for text in wrap.lines]
            if not _assigns_to_itself(updated_node):  # `opt = opt` (the optimizer itself) goes
                replacement.append(updated_node.with_changes(leading_lines=[]))  # (its comments go first)
            for call, wrap in before:
                self.ctx.rewrite(self._line(call), "hvd.DistributedOptimizer", wrap.note)
        elif original_node in self.plan.substitute:
            outcome = self.plan.substitute[original_node]
            self.ctx.rewrite(line, "hvd.join", outcome.note)
            replacement = list(outcome.node)
        elif original_node in self.plan.replace:
            outcome = self.plan.replace[original_node]
            self.ctx.rewrite(line, "hvd.DistributedOptimizer", outcome.note)
            replacement = list(outcome.node)
            call = updated_node.body[0].value  # type: ignore[attr-defined]
            target = original_node.body[0].targets[0].target  # type: ignore[attr-defined]
            inner = call.args[0].value
            if not (isinstance(inner, cst.Name) and inner.value == target.value):
                # `opt = <inner optimizer>`, from the updated tree so hvd.* inside is rewritten too
                replacement.append(cst.SimpleStatementLine(
                    [cst.Assign([cst.AssignTarget(cst.Name(target.value))], inner)]))
        elif len(original_node.body) == 1 and isinstance(original_node.body[0], cst.Expr):
            outcome = self.statement_calls.get(original_node.body[0].value)
            if isinstance(outcome, Rewritten):
                name = hvd_attr_name(original_node.body[0].value.func, self.ctx.hvd_aliases)
                self.ctx.rewrite(line, f"hvd.{name}", outcome.note)
                replacement = list(outcome.node)
        if frame.before:  # (the statement's comments go above the first of them)
            replacement = [*frame.before, *(replacement if replacement is not None
                                            else [updated_node.with_changes(leading_lines=[])])]
        if replacement is None:
            return self._with_todos(updated_node, frame)
        if not replacement:  # `opt = hvd.DistributedOptimizer(opt)` of a module replicated already
            return cst.RemoveFromParent()
        first = replacement[0].with_changes(leading_lines=updated_node.leading_lines)
        replacement[0] = self._with_todos(first, frame)
        return cst.FlattenSentinel(replacement)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node in self.dead:
            return False
        if isinstance(node, _COMPOUND):
            self.frames.append(_Frame())
            if node in self.plan.comments:
                self.frames[-1].comments.append(self.plan.comments[node])
        if isinstance(node, cst.Call) and hvd_attr_name(node.func, self.ctx.hvd_aliases):
            self.hvd_call_depth += 1
        return super().on_visit(node)

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> Union[cst.CSTNode, cst.FlattenSentinel, cst.RemovalSentinel]:
        if original_node in self.dead:  # (not visited, so no frame or depth of its own: it goes whole)
            return updated_node
        result = super().on_leave(original_node, updated_node)
        if isinstance(original_node, cst.Call) and hvd_attr_name(original_node.func, self.ctx.hvd_aliases):
            self.hvd_call_depth -= 1
        if isinstance(original_node, _COMPOUND):
            frame = self.frames.pop()
            if isinstance(result, cst.CSTNode):
                result = self._with_todos(result, frame)
            elif isinstance(result, cst.FlattenSentinel) and len(result.nodes):
                nodes = list(result.nodes)
                nodes[0] = self._with_todos(nodes[0], frame)
                result = cst.FlattenSentinel(nodes)
        return result

    def leave_With(  # type: ignore[override]
        self, original_node: cst.With, updated_node: cst.With
    ) -> Union[cst.With, cst.FlattenSentinel]:
        if original_node in self.plan.unwrap and isinstance(updated_node.body, cst.IndentedBlock):
            self.ctx.rewrite(self._line(original_node), "skip_synchronize",
                             "unwrapped: DDP gradients are already averaged, step() needs no sync")
            body = list(updated_node.body.body)
            if body:
                body[0] = body[0].with_changes(leading_lines=[*updated_node.leading_lines, *body[0].leading_lines])
            return cst.FlattenSentinel(body)
        return updated_node

    # -- probes of Horovod's API (rules/probes.py) ----------------------------------------------
    def _decide(self, node: Union[cst.If, cst.IfExp], taken: cst.CSTNode, other: Optional[cst.CSTNode]) -> None:
        """Record the decision of `node`'s test, if a probe settles it: the branch not taken is not
        visited (its Horovod uses go with it)."""
        value = probes.decided(node.test, self.ctx.hvd_aliases)
        if value is None:
            return
        self.decisions[node] = value
        dropped = other if value else taken
        if dropped is not None:
            self.dead.add(dropped)
        names = ", ".join(f"`{name}`" for name in probes.asked(node.test, self.ctx.hvd_aliases))
        self.ctx.rewrite(self._line(node), "hasattr(hvd, ...)",
                         f"-> the test is {value}: Horovod 0.28.1's horovod.torch has {names} or not, as "
                         "the test asks; only the branch it takes is kept")

    def visit_If(self, node: cst.If) -> None:
        self._decide(node, node.body, node.orelse)

    def leave_If(self, original_node: cst.If, updated_node: cst.If
                 ) -> Union[cst.BaseStatement, cst.FlattenSentinel, cst.RemovalSentinel]:
        if original_node not in self.decisions:
            return updated_node
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        if isinstance(parent, cst.If) and parent.orelse is original_node:  # an elif: its branch stays one
            if self.decisions[original_node]:
                return cst.Else(body=updated_node.body, leading_lines=updated_node.leading_lines)
            return updated_node.orelse if updated_node.orelse is not None else cst.RemoveFromParent()
        if self.decisions[original_node]:
            kept = list(updated_node.body.body)
        elif isinstance(updated_node.orelse, cst.If):  # elif: the next test decides
            return updated_node.orelse.with_changes(leading_lines=updated_node.leading_lines)
        elif isinstance(updated_node.orelse, cst.Else):
            kept = list(updated_node.orelse.body.body)
        else:
            return cst.RemoveFromParent()
        if not kept:
            return cst.RemoveFromParent()
        kept[0] = kept[0].with_changes(leading_lines=[*updated_node.leading_lines, *kept[0].leading_lines])
        return cst.FlattenSentinel(kept)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._decide(node, node.body, node.orelse)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        if original_node not in self.decisions:
            return updated_node
        kept = updated_node.body if self.decisions[original_node] else updated_node.orelse
        return kept.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar) if updated_node.lpar else kept

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> Union[cst.For, cst.With]:
        return self._joined(original_node, self._accumulated(original_node, updated_node))

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> Union[cst.While, cst.With]:
        return self._joined(original_node, updated_node)

    def _joined(self, original_node: Union[cst.For, cst.While], updated_node: Union[cst.For, cst.While]
                ) -> Union[cst.For, cst.While, cst.With]:
        """A loop that hvd.join() ended, under ``with Join([ddp_model]):``."""
        if original_node not in self.plan.join_loops:
            return updated_node
        item = cst.parse_expression(f"Join([{self.plan.join_loops[original_node]}])")
        self.ctx.rewrite(self._line(original_node), "hvd.join",
                         "the loop runs under DDP's Join: a rank out of data stands in with zeros, as under hvd.join()")
        return cst.With(items=[cst.WithItem(item=item)], leading_lines=updated_node.leading_lines,
                        body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]))

    def _accumulated(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if original_node not in self.plan.accumulate or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        accumulation, ddp_name = self.plan.accumulate[original_node]
        body = list(updated_node.body.body)
        inner, rest = body[: accumulation.count], body[accumulation.count :]
        item = cst.parse_expression(
            f"contextlib.nullcontext() if {accumulation.condition} else {ddp_name}.no_sync()")
        wrapper = cst.With(items=[cst.WithItem(item=item)], body=cst.IndentedBlock(body=inner))
        self.ctx.rewrite(self._line(original_node), "backward_passes_per_step",
                         "first backward passes of every group run under no_sync()")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[wrapper, *rest]))

    def visit_Decorator(self, node: cst.Decorator) -> Optional[bool]:
        # @hvd.elastic.run: dropped in leave_Decorator; its attribute is not flagged on the way.
        return hvd_attr_name(node.decorator, self.ctx.hvd_aliases) != elastic.DECORATOR

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator
                        ) -> Union[cst.Decorator, cst.RemovalSentinel]:
        if hvd_attr_name(original_node.decorator, self.ctx.hvd_aliases) != elastic.DECORATOR:
            return updated_node
        self.ctx.rewrite(self._line(original_node), "hvd.elastic.run",
                         "dropped: torchrun restarts every worker; the state resumes from its last commit")
        return cst.RemoveFromParent()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        message = lightning.removed_hook_message(node.name.value) if self.ctx.shared.lightning else None
        if message:
            self._flag(node, node.name.value, message)

    # -- expressions ------------------------------------------------------------------------
    def _module_as_value(self, node: Optional[cst.BaseExpression], where: cst.CSTNode) -> None:
        """``self._hvd = hvd``, ``f(hvd)``, ``return hvd``: what is reached through that other
        name is not rewritten (and keeps the file on Horovod), which the TODO says."""
        if isinstance(node, cst.Name) and node.value in self.ctx.hvd_aliases:
            self._flag(where, node.value, f"the module `{node.value}` is used as a value (stored, passed "
                       f"or returned): calls made through another name for it are not rewritten; "
                       f"call `{node.value}.NAME` where the module is imported")

    def visit_Assign(self, node: cst.Assign) -> None:
        self._module_as_value(node.value, node)

    def visit_Arg(self, node: cst.Arg) -> None:
        call = self.get_metadata(ParentNodeProvider, node, None)
        if call is None or probes.answer(call, self.ctx.hvd_aliases) is None:  # (a probe only asks)
            self._module_as_value(node.value, node)

    def visit_Return(self, node: cst.Return) -> None:
        self._module_as_value(node.value, node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        if original_node in self.plan.rename:
            return updated_node.with_changes(value=self.plan.rename[original_node])
        return updated_node

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Attribute):
            self.inner_attributes.add(node.value)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if original_node in self.plan.forwards:  # model.forward(x) -> model(x): the replicated module runs
            return updated_node.value.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        if original_node in self.plan.constants:
            native = self.plan.constants[original_node]
            self.ctx.rewrite(self._line(original_node), f"hvd.{hvd_attr_name(original_node, self.ctx.hvd_aliases)}",
                             f"-> {native} (a run-time choice the DDP rewrite follows)")
            return cst.parse_expression(native).with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        # A bare hvd.X: not a call (hvd calls raise hvd_call_depth) nor inside an hvd call, whose
        # own outcome covers it; a constant becomes its native value, anything else is flagged
        # once, at its outermost attribute.
        name = hvd_attr_name(original_node, self.ctx.hvd_aliases)
        if name is not None and self.hvd_call_depth == 0 and original_node not in self.inner_attributes \
                and self.ctx.shared.all_native:
            native = constants.native_value(name, self.ctx)
            if native is not None:
                self.ctx.rewrite(self._line(original_node), f"hvd.{name}",
                                 f"-> {native}, the value the native calls take (rules/constants.py)")
                return cst.parse_expression(native).with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        if name is None and original_node not in self.inner_attributes:
            other = hvd_attr_name(original_node, self.ctx.shared.horovod_aliases)
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            if other == "__version__":  # logged beside torch's: the version doing the work now
                self.ctx.need(HOROVOD, "torch")
                self.ctx.rewrite(self._line(original_node), "horovod.__version__",
                                 "-> torch.__version__ (no Horovod is left to report)")
                return cst.parse_expression("torch.__version__").with_changes(
                    lpar=updated_node.lpar, rpar=updated_node.rpar)
            if other is not None and not isinstance(parent, (cst.ImportAlias, cst.ImportFrom)) and not (
                    isinstance(parent, cst.Call) and parent.func is original_node and other in ("run", "spark.run")):
                self._flag(original_node, f"horovod.{other}", "only horovod.run(...) is rewritten "
                           "from a bare `import horovod`")
        if name is None or self.hvd_call_depth > 0 or original_node in self.inner_attributes:
            return updated_node
        self._flag(original_node, f"hvd.{name}", reason_for(name))
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        line = self._line(original_node)
        shared = self.ctx.shared
        known = probes.answer(original_node, self.ctx.hvd_aliases)
        if known is not None:  # a probe no if decided (those tests go whole): its answer
            name = probes.asked(original_node, self.ctx.hvd_aliases)[0]
            self.ctx.rewrite(line, "hasattr(hvd, ...)",
                             f"-> {known}: Horovod 0.28.1's horovod.torch {'has' if known else 'lacks'} `{name}`")
            return cst.Name(str(known))
        if runner.is_runner_constructor(original_node, shared.runner_names):
            return self._apply(original_node, updated_node, "HorovodRunner", runner.rewrite_constructor(updated_node, self.ctx))
        if runner.is_runner_run(original_node, shared.runner_names, shared.runner_vars):
            return self._apply(original_node, updated_node, "HorovodRunner.run", runner.rewrite_run(updated_node, self.ctx))
        if lightning.is_horovod_trainer(original_node):
            return self._apply(original_node, updated_node, "Trainer(accelerator='horovod')",
                               lightning.rewrite_trainer(updated_node, self.ctx))
        if runner.is_horovod_run(original_node, shared.horovod_aliases):
            used = not isinstance(self.get_metadata(ParentNodeProvider, original_node, None), cst.Expr)
            return self._apply(original_node, updated_node, "horovod.run",
                               runner.rewrite_horovod_run(updated_node, self.ctx, value_used=used))
        if runner.is_horovod_spark_run(original_node, shared.horovod_aliases):
            used = not isinstance(self.get_metadata(ParentNodeProvider, original_node, None), cst.Expr)
            return self._apply(original_node, updated_node, "horovod.spark.run",
                               runner.rewrite_horovod_spark_run(updated_node, self.ctx, value_used=used))
        if sampler.is_sampler(original_node):
            return sampler.rewrite_sampler(original_node, updated_node, self.ctx, line)
        name = hvd_attr_name(original_node.func, self.ctx.hvd_aliases)
        if name is None:
            if _int_of_int(original_node, updated_node, self.ctx.hvd_aliases):
                return updated_node.args[0].value
            unfollowed = flags.unfollowed_horovod_call(original_node)
            if unfollowed is not None:
                self._flag(original_node, *unfollowed)
            return updated_node
        if original_node in self.statement_calls:
            outcome = self.statement_calls[original_node]
            if isinstance(outcome, Flagged):
                self._flag(original_node, f"hvd.{name}", outcome.message)
            return updated_node
        if original_node in self.plan.inplace:  # the optimizer itself; its model is replicated
            args = updated_node.args
            inner = next((a.value for a in args if a.keyword is not None and a.keyword.value == "optimizer"),
                         args[0].value)
            return inner.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar) if updated_node.lpar \
                else inner
        if name == "DistributedOptimizer" and original_node not in self.plan.flagged:
            return updated_node  # its statement is replaced in leave_SimpleStatementLine
        if original_node in self.plan.flagged:
            why = self.plan.flagged[original_node]
            if name == "DistributedOptimizer" and self.ctx.shared.emulate:
                native = optimizer_hooks.rewrite(updated_node, self.ctx, why)
                if native is not None:  # Horovod's own semantics, no DDP proof needed
                    return self._apply(original_node, updated_node, f"hvd.{name}", native)
            elif name == "DistributedOptimizer" and optimizer_hooks.could_rewrite(updated_node, self.ctx):
                why += (" (--emulate writes _native_distributed_optimizer here instead: Horovod's "
                        "averaging in the optimizer, the same numbers)")
            self._flag(original_node, f"hvd.{name}", why)
            return updated_node
        if name in ("init", "shutdown"):
            self._flag(original_node, f"hvd.{name}", "only rewritten as a statement of its own")
            return updated_node
        rule = CALL_RULES.get(name)
        if rule is None:
            self._flag(original_node, f"hvd.{name}", reason_for(name))
            return updated_node
        return self._apply(original_node, updated_node, f"hvd.{name}", rule(name, updated_node, self.ctx))

    def _apply(self, original: cst.Call, updated: cst.Call, label: str, outcome: Outcome) -> cst.BaseExpression:
        if isinstance(outcome, Flagged):
            self._flag(original, label, outcome.message)
            return updated
        node = outcome.node
        assert isinstance(node, cst.BaseExpression)
        if outcome.before:
            if not (self.frames and self.frames[-1].simple):
                self._flag(original, label, "only rewritten in a statement of its own line (it needs a "
                           "statement before it)")
                return updated
            self.frames[-1].before += [cst.parse_statement(text) for text in outcome.before]
        if node is not updated:
            self.ctx.rewrite(self._line(original), label, outcome.note)
        if outcome.todo:
            self._flag(original, label, outcome.todo)
        if updated.lpar:
            return node.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        if not isinstance(node, (cst.Call, cst.Name, cst.Attribute, cst.Subscript, cst.ListComp)):
            # e.g. `a // b` replacing a call inside `x / hvd.cross_size()`: keep precedence.
            return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return node

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        module = flags.horovod_module_named(original_node)
        if module is not None:
            self._flag(original_node, module, flags.MODULE_BY_NAME)
        if "HOROVOD_TIMELINE" in original_node.value:
            self._flag(original_node, "HOROVOD_TIMELINE",
                       "has no effect without Horovod; record with torch.profiler instead (see the guide)")
        return updated_node


def _int_of_int(original: cst.Call, updated: cst.Call, aliases) -> bool:
    """``int(hvd.local_rank())`` whose argument became ``int(os.environ["LOCAL_RANK"])``: the
    outer ``int()`` adds nothing, so the rewrite keeps one."""
    if not (isinstance(updated.func, cst.Name) and updated.func.value == "int" and len(updated.args) == 1
            and updated.args[0].keyword is None and not updated.args[0].star):
        return False
    before, after = original.args[0].value, updated.args[0].value
    return (isinstance(before, cst.Call) and hvd_attr_name(before.func, aliases) is not None
            and isinstance(after, cst.Call) and isinstance(after.func, cst.Name) and after.func.value == "int")
