"""``hvd.DistributedOptimizer`` where the ``DDP(model)`` wrapper cannot be proven -> the model made
data-parallel in place with torch's composable ``replicate(model)``.

``optimizer.py`` writes ``ddp_model = DDP(model)`` only when every forward pass provably goes
through the wrapper. Real programs keep the model on an attribute, pass it to other functions,
build it from a registry or keep several models under one optimizer. ``replicate(model)`` covers
them: it turns the module object the program already holds into a data-parallel one (DDP's reducer
in forward hooks), so every ``model(...)`` call, wherever it is made, averages the gradients in
``backward()``. What it cannot cover stays with the caller's own choice of fallback:

* the model must be found: ``named_parameters=M.named_parameters()``, or an optimizer built over
  ``M.parameters()``, param groups (``[{"params": M.parameters()}, ...]``), ``list(A.parameters())
  + list(B.parameters())``, ``itertools.chain(...)`` or a filter over them (one model per module
  found, each a name or attribute chain); a raw tensor in the params (a learned temperature) is not
  a module DDP can own, so it blocks the rewrite; ``named_parameters=R.method()``, a method of the
  program's own whose body this file does not show, is taken to be the parameters of the one module
  the program broadcasts (``hvd.broadcast_parameters(R.model.state_dict())``), and two lines before
  the wrap check that at run time, stopping the program before its first step if it is wrong;
* ``M.forward(...)`` bypasses the hooks, ``copy.deepcopy(M)`` after the wrap and ``torch.save(M)``
  (the whole module) fail on a replicated module: each blocks the rewrite;
* the wrap runs once per module (``replicate`` refuses a second application, with an
  AssertionError): outside loops, or in ``for`` loops each of whose variables the module is, or is
  reached through (``for k in models: ... models[k][0].named_parameters()``, ``for m in models: ...
  m.named_parameters()``: a new module each time, or that error at once), or whose body binds
  the module's name to a new object before the wrap (``for fold in folds: model = Net() ...``),
  and a second wrap of the same name only after the name was bound to a new module;
* options as in optimizer.py: fp16 compression -> DDP's fp16 comm hook; ``groups`` dropped;
  Average only; ``backward_passes_per_step=N`` averages on every ``backward()`` (the same
  gradients up to rounding, N times the traffic: no loop in view to put ``no_sync()`` around);
  ``**kwargs`` block it.

Every parameter is not proven to get a gradient on every step, so the wrap passes
``find_unused_parameters=True`` (DDP refuses such a step without it); a parameter that no rank used
keeps ``grad=None`` where Horovod averaged zeros (migration_guide/differences.md).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Optional, Tuple, Union

import libcst as cst
from libcst.metadata import Scope

from horovod_compat.migrate import torch_api
from horovod_compat.migrate.context import HVD, RewriteContext, code_of, has_star_args, keyword_args, positional_args

#: `facts` and `options` below are optimizer.py's (its analysis metadata: positions, scopes,
#: parents, module_code; and what the call's options become), passed in by it: this module sits
#: below optimizer.py and imports nothing of it.
Facts = Any
Options = Any


@dataclasses.dataclass
class InPlace:
    """The in-place rewrite of one DistributedOptimizer call."""

    #: the statement before which the replicate() lines go
    statement: cst.SimpleStatementLine
    lines: List[str]
    note: str
    #: the modules replicated, and the names the file gives them too (`_aliases`)
    models: List[str] = dataclasses.field(default_factory=list)
    #: ``model.forward`` of each ``model.forward(...)`` call, to become ``model(...)`` (`_forwards`),
    #: with the statement each is in
    forwards: Dict[cst.Attribute, cst.SimpleStatementLine] = dataclasses.field(default_factory=dict)


#: Calls that pass parameters through unchanged (``list(m.parameters())``, ``chain(a, b)``).
_PASS_THROUGH = {"list", "tuple", "chain", "itertools.chain", "filter"}
_BLOCKS_FUNCTIONS = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _is_index(node: cst.BaseExpression) -> bool:
    """A literal (``0``, ``-1``, ``"gen"``) or a name."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.SimpleString, cst.Name))


def _is_module_expr(node: cst.BaseExpression) -> bool:
    """A name or attribute chain (``model``, ``self.model``, ``self.heads[0]``, ``models[k]``) with
    no calls; an index is a literal or a name."""
    while True:
        if isinstance(node, cst.Name):
            return True
        if isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Subscript) and all(
                isinstance(e.slice, cst.Index) and _is_index(e.slice.value) for e in node.slice):
            node = node.value
        else:
            return False


class _Models:
    """The modules whose parameters a parameter expression holds, or why they cannot be told."""

    def __init__(self, scope: Optional[Scope], wrap: cst.SimpleStatementLine, facts: Facts,
                 named: bool) -> None:
        self.scope, self.wrap, self.facts = scope, wrap, facts
        self.before_line = facts.positions[wrap].start.line
        #: the expression is named_parameters= ((name, parameter) pairs), not an optimizer's params
        self.named = named
        self.found: Dict[str, None] = {}
        #: module -> the call whose parameters were taken to be its (`_broadcast_module`)
        self.assumed: Dict[str, str] = {}
        self.problem: Optional[str] = None

    def fail(self, node: cst.CSTNode, why: str) -> None:
        if self.problem is None:
            self.problem = f"`{code_of(node).strip()}` {why}"

    def params(self, node: cst.BaseExpression, depth: int = 0) -> None:
        """Follow `node`, an expression that yields parameters (or (name, parameter) pairs)."""
        if self.problem is not None:
            return
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in ("parameters", "named_parameters"):
            if not _is_module_expr(node.func.value):
                return self.fail(node.func.value, "is not a name or attribute the rewriter can hand to replicate()")
            self.found[code_of(node.func.value).strip()] = None
            return
        if isinstance(node, cst.Call) and code_of(node.func).strip() in _PASS_THROUGH and not has_star_args(node):
            for arg in node.args:
                if arg.keyword is None:
                    if code_of(node.func).strip() == "filter" and arg is node.args[0]:
                        continue  # the predicate
                    self.params(arg.value, depth)
            return
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            self.params(node.left, depth)
            self.params(node.right, depth)
            return
        if isinstance(node, (cst.List, cst.Tuple)):
            for element in node.elements:
                if isinstance(element, cst.StarredElement):
                    self.params(element.value, depth)
                elif isinstance(element.value, cst.Dict):  # a param group
                    groups = {code_of(e.key).strip().strip("'\""): e.value for e in element.value.elements
                              if isinstance(e, cst.DictElement)}
                    if "params" not in groups:
                        return self.fail(element.value, "is a param group without a literal \"params\" key")
                    self.params(groups["params"], depth)
                else:
                    self.params(element.value, depth)
            return
        if isinstance(node, (cst.ListComp, cst.GeneratorExp)) and len(_comp_fors(node)) == 1:
            self.params(_comp_fors(node)[0].iter, depth)
            return
        if isinstance(node, cst.Name) and depth < 3:
            value = self._bound_value(node)
            if value is not None:
                return self.params(value, depth + 1)
        module = _broadcast_module(node, self.facts.module_code) if self.named else None
        if module is not None:
            self.found[module] = None
            self.assumed[module] = code_of(node).strip()
            return
        self.fail(node, "is not a module's parameters() the rewriter can follow")

    def optimizer(self, node: cst.BaseExpression, depth: int = 0) -> None:
        """Follow `node`, the optimizer Horovod wraps: the parameters it was built over."""
        if isinstance(node, cst.Name) and depth < 3:
            value = self._bound_value(node)
            if value is not None:
                return self.optimizer(value, depth + 1)
        if isinstance(node, cst.Call) and not has_star_args(node):
            kw, pos = keyword_args(node), positional_args(node)
            if "params" in kw:
                return self.params(kw["params"].value)
            if pos:
                return self.params(pos[0].value)
        self.fail(node, "is an optimizer whose parameters the rewriter cannot follow (pass "
                        "named_parameters=model.named_parameters() to DistributedOptimizer)")

    def _bound_value(self, name: cst.Name) -> Optional[cst.BaseExpression]:
        """The value `name` holds at the wrap: that of its last ``name = value`` binding in this
        scope before the wrap, when that binding's statement sits in a block around the wrap with
        no loop or function between them (``optimizer = SGD(...)`` then ``optimizer =
        hvd.DistributedOptimizer(optimizer)``, also inside ``if args.horovod:``). A later binding
        in a branch, or one in a loop around the wrap, leaves it unknown."""
        if self.scope is None:
            return None
        bindings = [a for a in self.scope[name.value] if hasattr(a, "node")]
        if not bindings or any(b.scope is not self.scope for b in bindings):
            return None
        parents, positions = self.facts.parents, self.facts.positions
        assigns = [parents.get(parents.get(b.node)) for b in bindings]
        before = [a for a in assigns if a is not None and a in positions
                  and positions[a].start.line < self.before_line]
        if not before or any(not isinstance(a, cst.Assign) for a in before):
            return None
        assign = max(before, key=lambda a: positions[a].start.line)
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            return None
        if len(bindings) > 1 and not self._encloses_wrap(parents.get(parents.get(assign))):
            return None
        return assign.value

    def _encloses_wrap(self, block: Optional[cst.CSTNode]) -> bool:
        """`block` (the body holding a binding) is the wrap's or one around it, with no loop or
        function in between, so that the binding is the last one the wrap's line sees."""
        node: Optional[cst.CSTNode] = self.wrap
        while node is not None and node is not block:
            if isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            node = self.facts.parents.get(node)
        return node is not None


def _broadcast_module(node: cst.BaseExpression, code: str) -> Optional[str]:
    """For ``named_parameters=R.method()`` (a method of the program's own, such as
    ``model.get_named_parameters()``, whose body is in another file): the module M that the
    program broadcasts, ``hvd.broadcast_parameters(M.state_dict(), ...)``, where M is R or under R
    and the only such module. A Horovod program broadcasts the model it trains, so M is taken to
    hold those parameters; the rewrite checks that at run time (`_ASSUMED_CHECK`)."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and not node.args
            and _is_module_expr(node.func.value)):
        return None
    owner = code_of(node.func.value).strip()
    broadcast = set(re.findall(r"\.broadcast_parameters\(\s*([\w.]+)\.state_dict\(\)", code))
    under = [m for m in broadcast if m == owner or m.startswith(owner + ".")]
    return under[0] if len(broadcast) == 1 and len(under) == 1 else None


#: Lines before the replicate() of a module whose parameters were taken from the program's
#: broadcast (`_broadcast_module`): the assumption, checked.
_ASSUMED_CHECK = (
    "if not {{id(p) for _, p in {call}}} <= {{id(p) for p in {module}.parameters()}}:  # named_parameters={call}, taken to be {module}'s\n"
    "    raise RuntimeError(\"{call} holds parameters outside {module}, which replicate() averages\")\n")


def _comp_fors(node: Union[cst.ListComp, cst.GeneratorExp]) -> List[cst.CompFor]:
    fors, current = [], node.for_in
    while current is not None:
        fors.append(current)
        current = current.inner_for_in
    return fors


def _statement(call: cst.Call, facts: Facts) -> Union[cst.SimpleStatementLine, str]:
    """The statement the call is part of, where lines can go before it, or why there is none."""
    node: cst.CSTNode = call
    while not isinstance(node, cst.SimpleStatementLine):
        node = facts.parents.get(node)
        if node is None or isinstance(node, cst.BaseCompoundStatement):
            return "the call is not part of a simple statement"
        if isinstance(node, _BLOCKS_FUNCTIONS):
            return "the call sits in a lambda or comprehension"
    return node


def _loop_variables(stmt: cst.SimpleStatementLine, facts: Facts) -> Union[List[Tuple[str, cst.For]], str]:
    """The variables of the ``for`` loops around `stmt` in its function, with the loops, or why
    a loop there cannot wrap a new module on each turn (``replicate()`` makes a module
    data-parallel once)."""
    loops, up = [], facts.parents.get(stmt)
    while up is not None and not isinstance(up, (cst.FunctionDef, cst.Module)):
        if isinstance(up, cst.While) or (isinstance(up, cst.For) and not isinstance(up.target, cst.Name)):
            return "the wrap sits inside a loop, and replicate() makes a module data-parallel only once"
        if isinstance(up, cst.For):
            loops.append((up.target.value, up))
        up = facts.parents.get(up)
    return loops


def _built_each_turn(model: str, loop: cst.For, stmt: cst.SimpleStatementLine, facts: Facts) -> bool:
    """True when a statement of `loop`'s own body, before the one that holds `stmt`, binds the
    plain name `model` to an expression that does not use it (``model = Net()``): each turn then
    wraps a module of its own."""
    if not model.isidentifier():
        return False
    holder = stmt
    while holder is not None and facts.parents.get(holder) is not loop.body:
        holder = facts.parents.get(holder)
    for line in loop.body.body:
        if line is holder:
            return False
        for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == model
                                                     for t in small.targets) \
                    and not re.search(rf"(?<![\w.]){re.escape(model)}(?!\w)", code_of(small.value)):
                return True
    return False


def _end_of_function(stmt: cst.SimpleStatementLine, facts: Facts) -> int:
    """The last line of the function around `stmt` (of the file at module level)."""
    up = facts.parents.get(stmt)
    while up is not None and not isinstance(up, cst.FunctionDef):
        up = facts.parents.get(up)
    return facts.positions[up].end.line if up is not None else len(facts.module_code.splitlines())


#: Module methods that return the module itself: `model = model.cpu()` keeps the replicated object.
_SELF_MOVES = "cuda|cpu|to|half|float|double|bfloat16|train|eval|requires_grad_"


def _aliases(model: str, facts: Facts) -> List[str]:
    """`model` and the names or attributes the file assigns it to (``self.model = model``): the
    same module object under other names, which the checks below must see too."""
    last = model.rsplit(".", 1)[-1]
    found = [model]
    for node in facts.positions:
        if isinstance(node, cst.Assign) and code_of(node.value).strip() in (model, last):
            found += [code_of(t.target).strip() for t in node.targets
                      if _is_module_expr(t.target) and code_of(t.target).strip() not in found]
    return found


def _parameters_given(names: List[str], facts: Facts) -> List[str]:
    """The parameters of the file's functions that any of `names` is passed to
    (``save_checkpoint(model, path)`` with ``def save_checkpoint(net, where)``: ``net``), and
    those these pass on in turn: the module under the names the code that receives it uses."""
    functions: Dict[str, List[cst.FunctionDef]] = {}
    for node in facts.positions:
        if isinstance(node, cst.FunctionDef):
            functions.setdefault(node.name.value, []).append(node)
    found = list(names)
    for name in found:  # (grows while it is walked)
        for node in facts.positions:
            if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
                    and node.func.value in functions):
                continue
            plain = [a for a in node.args if a.keyword is None and a.star == ""]
            for arg in node.args:
                if arg.star or code_of(arg.value).strip() != name:
                    continue
                for fn in functions[node.func.value]:
                    params = fn.params.params
                    given = [p.name.value for p in (*params, *fn.params.kwonly_params)
                             if arg.keyword is not None and p.name.value == arg.keyword.value]
                    if arg.keyword is None and plain.index(arg) < len(params):
                        given = [params[plain.index(arg)].name.value]
                    found += [g for g in given if g not in found]
    return found


def _hazard(model: str, names: List[str], line: int, end: int, facts: Facts) -> Optional[str]:
    """What in the file would break on a replicated `model` (see the module docstring), known also
    by `names` (`_aliases`), for a wrap at `line` of a function (or module) that ends at line
    `end`; the file's functions that receive the module are searched too (`_parameters_given`,
    by the parameter's name, wherever it is written: a match elsewhere only blocks the rewrite)."""
    code = facts.module_code
    after = "\n".join(code.splitlines()[line:])
    for name in _parameters_given(names, facts):
        m = re.escape(name)
        known = f"`{name}`" if name in names else f"`{model}` (as `{name}`, a parameter it is passed to)"
        if re.search(rf"deepcopy\(\s*{m}\s*\)", after):
            return (f"`copy.deepcopy({name})` after the wrap" + ("" if name in names else f" (of {known})")
                    + " fails on a replicated module (copy its state_dict instead)")
        if re.search(rf"(?:torch\.save|pickle\.dumps?|cloudpickle\.dumps?)\(\s*{m}\s*[,)]", code):
            return f"the whole module {known} is pickled, which fails once it is replicated (save its state_dict)"
    later = _rebound_after(model, names, line, end, facts)
    if later:
        return f"`{model}` is re-bound at line {later}, after the wrap"
    return None


#: Calls that wrap a module and run it, hooks and all, on every call of the wrapper: ``model =
#: torch.compile(model)`` after the wrap still trains the replicated module (checked under torchrun:
#: tests/horovod_compat/migrate/test_migrate_inplace.py).
_RUNS_MODULE = re.compile(r"(?:torch\.)?(?:nn\.)?(?:parallel\.)?(?:compile|DataParallel|SyncBatchNorm\.convert_sync_batchnorm)$")


def _runs_module(value: cst.BaseExpression, names: List[str]) -> bool:
    """`value` is one of `names` (the model or an alias), a call that returns the module itself
    (``.cpu()``, `_SELF_MOVES`) on such a value, or a `_RUNS_MODULE` wrapper around one."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and re.fullmatch(_SELF_MOVES, value.func.attr.value):
        return _runs_module(value.func.value, names)
    if isinstance(value, cst.Call) and _RUNS_MODULE.match(code_of(value.func).strip()) and value.args \
            and value.args[0].keyword is None and value.args[0].star == "":
        return _runs_module(value.args[0].value, names)
    return code_of(value).strip() in names


#: Calls that load a module from a file: its parameters are new objects, never the ones the
#: wrapped optimizer holds, so neither Horovod nor the replicated module averaged them.
_LOADED = re.compile(r"(?:torch\.)?(?:jit\.)?load$")


#: The comment above a statement where ``model.forward(x)`` became ``model(x)``.
FORWARD_COMMENT = ("# DDP: the module is called, not its forward(), so that its gradients are averaged "
                   "(this also runs any forward hooks it has)")


def _forwards(names: List[str], facts: Facts
              ) -> Union[Dict[cst.Attribute, cst.SimpleStatementLine], str]:
    """``model.forward`` of every ``model.forward(...)`` call of the model known by `names`: a
    call of the replicated module runs DDP's hooks, its forward() does not. Why not, where one
    is not a plain call in a simple statement (or the text shows more of them than the tree)."""
    found: Dict[cst.Attribute, cst.SimpleStatementLine] = {}
    for node in facts.positions:
        if not (isinstance(node, cst.Attribute) and node.attr.value == "forward"
                and code_of(node.value).strip() in names):
            continue
        call = facts.parents.get(node)
        if not (isinstance(call, cst.Call) and call.func is node):
            return f"`{code_of(node).strip()}` is used as a value: a call through it would bypass the data-parallel hooks"
        statement: Optional[cst.CSTNode] = call
        while statement is not None and not isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            statement = facts.parents.get(statement)
        if not isinstance(statement, cst.SimpleStatementLine):
            return f"`{code_of(node).strip()}(...)` would bypass the data-parallel hooks (it is not in a simple statement)"
        found[node] = statement
    written = sum(len(re.findall(rf"(?<![\w.]){re.escape(n)}\s*\.\s*forward\s*\(", facts.module_code))
                  for n in names)
    if written != len(found):
        return f"`{names[0]}.forward(...)` would bypass the data-parallel hooks"
    return found


def _rebound_after(model: str, names: List[str], line: int, end: int, facts: Facts) -> Optional[int]:
    """The first line after `line` (to `end`) that assigns `model` another object (``model = ...``;
    ``model = model.cpu()`` and the other calls that return the module itself keep it, so do
    ``torch.compile(model)``, ``DataParallel(model)`` and ``convert_sync_batchnorm(model)``, which
    call it, and ``f(model=model)`` is a keyword argument, not an assignment; ``model =
    torch.load(f)``, the best model read back to be tested, runs outside the optimizer's
    parameters under Horovod and natively alike). A name bound with
    others (``model, opt = build()``) starts a new model with its own optimizer, wrapped again if
    the program trains it distributed. `names`: the model's and its aliases' (`_aliases`)."""
    found = []
    for node, where in facts.positions.items():
        if isinstance(node, cst.Assign) and line < where.start.line <= end \
                and any(code_of(t.target).strip() == model for t in node.targets) \
                and not _runs_module(node.value, names) \
                and not (isinstance(node.value, cst.Call) and _LOADED.match(code_of(node.value.func).strip())):
            found.append(where.start.line)
    return min(found, default=None)


def inside(facts: Facts, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    """`node`'s source lies within `outer`'s."""
    inner, rng = facts.positions[node], facts.positions[outer]
    return (rng.start.line, rng.start.column) <= (inner.start.line, inner.start.column) \
        and (inner.end.line, inner.end.column) <= (rng.end.line, rng.end.column)


def _exclusive(a: cst.CSTNode, b: cst.CSTNode, facts: Facts) -> bool:
    """True when statements `a` and `b` sit in different arms of one ``if`` (``elif``/``else``
    included): one run takes one of them only."""
    node = facts.parents.get(a)
    while node is not None:
        if isinstance(node, cst.If) and inside(facts, b, node):
            arms = [arm for arm in (node.body, node.orelse) if arm is not None]
            return [inside(facts, a, arm) for arm in arms] != [inside(facts, b, arm) for arm in arms]
        node = facts.parents.get(node)
    return False


def _rebound_between(model: str, first: int, line: int, facts: Facts, call: cst.Call) -> bool:
    """True when the plain name `model`, wrapped at line `first`, is bound again (``model, opt =
    build()``) before the wrap at `line`, in the scope of this wrap: the name then holds a new
    module, which replicate() has not seen."""
    scope = facts.scopes.get(call)
    if scope is None or not model.isidentifier() or model not in scope.assignments:
        return False
    return any(first < facts.positions[a.node].start.line < line for a in scope.assignments[model]
               if a.node in facts.positions)


#: The comment at each replicate() line: the difference from Horovod it carries.
UNUSED_COMMENT = "unused parameters keep grad None (Horovod: zeros)"
_COMMENT = "# DDP in place; " + UNUSED_COMMENT


def plan(call: cst.Call, facts: Facts, ctx: RewriteContext, options: Options,
         taken: Dict[str, Tuple[cst.SimpleStatementLine, bool]], first: List[str]) -> Union[InPlace, str]:
    """The in-place rewrite of the DistributedOptimizer `call`, or why it cannot be made.

    `options` is what optimizer.py made of the call's options (without an error); `taken` holds
    the models other wraps of this module already replicated, with the statement of their wrap and
    whether its options were Horovod's plain average;
    `first`, the lines that go first (optimizer.py's: the inner optimizer's state cleared)."""
    if not torch_api.has("replicate"):
        return "this torch has no torch.distributed._composable.replicate"
    if has_star_args(call):
        return "its options come as **kwargs, which the rewriter cannot read"
    if (options.fp16 != "False" or options.sum != "False") and not torch_api.has("replicate.register_comm_hook"):
        return "this torch's replicate() takes no comm hook (for fp16 compression or op=hvd.Sum)"
    stmt = _statement(call, facts)
    if isinstance(stmt, str):
        return stmt
    loops = _loop_variables(stmt, facts)
    if isinstance(loops, str):
        return loops
    line = facts.positions[stmt].start.line
    kw, pos = keyword_args(call), positional_args(call)
    named = kw["named_parameters"].value if "named_parameters" in kw else pos[1].value if len(pos) > 1 else None
    models = _Models(facts.scopes.get(call), stmt, facts, named is not None)
    if named is not None:
        models.params(named)
    else:
        inner = kw["optimizer"].value if "optimizer" in kw else pos[0].value if pos else None
        if inner is None:
            return "the call names no optimizer"
        models.optimizer(inner)
    if models.problem:
        return models.problem
    found = list(models.found)
    if not found:
        return "it holds no module's parameters"
    #: each model's names in the file: its own and its aliases'
    aliases = {model: _aliases(model, facts) for model in found}
    #: Horovod's plain average (no compression, op, accumulation or set): a second wrap of a module
    #: with it, after a first one with it in the same block, shares that wrap's replicate()
    plain = (options.fp16 == "False" and options.sum == "False" and options.passes == "1"
             and not options.process_group and options.adasum == "False")
    shared: List[str] = []
    for model in found:
        earlier, earlier_plain = taken.get(model, (None, False))
        if earlier is not None and not _exclusive(earlier, stmt, facts) \
                and not _rebound_between(model, facts.positions[earlier].start.line, line, facts, call):
            if not (plain and earlier_plain and facts.parents.get(earlier) is facts.parents.get(stmt)):
                return f"`{model}` is also under another DistributedOptimizer; replicate() applies once per module"
            shared.append(model)  # replicated by the wrap before it in this block, with the same options
        fixed = [v for v, loop in loops if not re.search(rf"(?<![\w.]){re.escape(v)}(?!\w)", model)
                 and not _built_each_turn(model, loop, stmt, facts)]
        if fixed:
            return (f"the wrap sits inside a loop over `{fixed[0]}`, and `{model}` does not change with "
                    "it: replicate() makes a module data-parallel only once")
        hazard = _hazard(model, aliases[model], line, _end_of_function(stmt, facts), facts)
        if hazard:
            return hazard
    forwards = {}
    for model in found:
        calls = _forwards(aliases[model], facts)
        if isinstance(calls, str):
            return calls
        forwards.update(calls)
    data_parallel = [name for model in found for name in aliases[model]
                     if re.search(rf"(?<!\w)DataParallel\(\s*{re.escape(name)}\s*[,)]", facts.module_code)]
    taken.update(dict.fromkeys(found, (stmt, plain)))
    lines = list(first)
    # backward_passes_per_step=N: DDP averages on every backward() (nothing here shows the loop
    # to put no_sync around), adding averaged gradients where Horovod averaged their sum: the
    # same gradients, up to rounding, for N times the traffic (differences.md)
    passes = "" if options.passes == "1" else f"; averages every backward() (Horovod: every {options.passes})"
    for model in found:
        if model in models.assumed:
            lines.append(_ASSUMED_CHECK.format(call=models.assumed[model], module=model))
        if model in shared:
            continue  # (its replicate() is the earlier wrap's)
        adasum = options.adasum_comment()
        group = f", process_group={options.process_group}" if options.process_group else ""
        lines.append(f"replicate({model}, find_unused_parameters=True{group})  {_COMMENT}{passes}"
                     + (f"; {adasum}" if adasum else "") + "\n")
        lines += options.comm_hook_lines(model, ctx)
    ctx.need(HVD, "replicate")
    names = ", ".join(f"`{m}`" for m in found)
    reduces = {"True": "sums", "False": "averages"}.get(options.sum, f"sums (when {options.sum}) or averages")
    own = [m for m in found if m not in shared]
    note = (f"-> replicate({', '.join(own)}) before this line, and " if own else "-> ") + (
            f"the optimizer itself: every call of "
            f"{names} {reduces} its gradients in backward() (DDP in place); find_unused_parameters=True, "
            "so a parameter no rank used in a step keeps grad None where Horovod averaged zeros")
    if shared:
        note += (f"; {', '.join(f'`{m}`' for m in shared)} already replicated by the wrap before this one "
                 "(one replicate() per module; each optimizer steps its own parameters)")
    if passes:
        note += (f"; backward_passes_per_step={options.passes}: every backward() averages the gradients it adds "
                 "(the rewrite writes no no_sync()), the same gradients up to rounding for "
                 f"{options.passes} times the traffic")
    for model, call in models.assumed.items():
        note += (f"; {call} taken to be `{model}`'s parameters (the module the program broadcasts), "
                 "checked at run time")
    if data_parallel:
        note += (f"; `DataParallel({data_parallel[0]})` runs the replicated module: right on one device per "
                 "process, but over several GPUs of one process DataParallel copies it, which replicate() "
                 "does not support (use one process per GPU)")
    if forwards:
        note += (f"; {len(forwards)} call(s) of `.forward(...)` call the module instead, so that DDP's hooks "
                 "run (and any forward hooks of its own)")
    if options.notes:
        note += "; " + "; ".join(options.notes)
    return InPlace(stmt, lines, note, [name for model in found for name in aliases[model]], forwards)
