"""``backward_passes_per_step=N`` -> ``no_sync()`` for the one loop shape that can be proven.

Horovod's ``DistributedOptimizer(..., backward_passes_per_step=N)`` keeps the first N-1 backward
passes local (gradients are summed in ``.grad``) and averages across ranks on the N-th.  DDP does
the same when the first N-1 backward passes run inside ``ddp_model.no_sync()``.  Which passes
those are depends on the loop, so the rewrite is made only for this shape::

    for i, <anything> in enumerate(<iterable>):
        <statements ending with the single X.backward() of the loop>
        ...
        if (i + 1) % N == 0:         # N: the same literal as backward_passes_per_step
            ... opt.step() ...       # the loop's only step(), and every zero_grad() of the loop
            ...

which becomes::

    for i, <anything> in enumerate(<iterable>):
        with contextlib.nullcontext() if (i + 1) % N == 0 else ddp_model.no_sync():
            <statements ending with X.backward()>
        ...
        if (i + 1) % N == 0:
            ...

The second shape splits each batch into sub-batches (Horovod's ImageNet example)::

    for ...:
        ...
        for i in range(<start>, <stop>, <step>):   # every pass of the step
            <statements ending with the single X.backward() of the function>
        opt.step()                                 # the function's only step(), later in that block

Horovod averaged at the N-th backward pass or at ``step()``, whichever came first, so every pass
but the last of each run of the inner loop accumulates locally::

        for i in range(<start>, <stop>, <step>):
            with contextlib.nullcontext() if i + <step> >= <stop> else ddp_model.no_sync():
                <statements ending with X.backward()>

(``<stop>`` and ``<step>`` are evaluated again, so they must be names, attributes, subscripts by
literals, literals or ``len()`` of one, of names the loop does not re-bind; a negative step is
refused.)

Every forward call of the model outside ``torch.no_grad()``/``torch.inference_mode()`` (a
``with`` or a decorator) and outside a function that only evaluates (no backward, nothing
returned or stored: ``_only_evaluates``) must be in the wrapped statements.  Anything else stays a
TODO.
"""
from __future__ import annotations

import dataclasses
import re
from typing import List, Mapping, Optional, Union

import libcst as cst

from horovod_compat.migrate.context import code_of


@dataclasses.dataclass
class Accumulation:
    """Wrap the first `count` statements of `loop`'s body in the no_sync/nullcontext `with`."""

    loop: cst.For
    count: int
    condition: str


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


_NO_GRAD = ("torch.no_grad()", "torch.inference_mode()", "torch.no_grad", "torch.inference_mode")


def _inside_no_grad(node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Under ``with torch.no_grad():`` (or inference_mode), in a function decorated with it, or in
    a function that only evaluates (`_only_evaluates`): a forward call no backward() can follow."""
    function = None
    while node in parents:
        node = parents[node]
        if isinstance(node, cst.With) and any(_squash(code_of(item.item)) in _NO_GRAD for item in node.items):
            return True
        if isinstance(node, cst.FunctionDef):
            if any(_squash(code_of(d.decorator)) in _NO_GRAD for d in node.decorators):
                return True
            function = function or node
    return function is not None and _only_evaluates(function)


class _Escapes(cst.CSTVisitor):
    """Whether a function's values can leave it, or a backward pass run in it."""

    def __init__(self) -> None:
        self.found = False

    def visit_Return(self, node: cst.Return) -> None:
        self.found |= node.value is not None

    def visit_Yield(self, node: cst.Yield) -> None:
        self.found = True

    def visit_Global(self, node: cst.Global) -> None:
        self.found = True

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.found = True

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.found |= isinstance(node.target, (cst.Attribute, cst.Subscript))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.found |= isinstance(node.target, (cst.Attribute, cst.Subscript))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.found |= node.attr.value in ("backward", "append", "extend", "insert", "add", "update",
                                          "put", "setdefault")


def _only_evaluates(function: cst.FunctionDef) -> bool:
    """True for a function (an evaluation loop, say) whose forward results cannot reach a
    backward pass: it calls no ``.backward()``, returns and yields no value, and stores nothing
    outside its own local names (no global, attribute or subscript assignment, no append/update).
    Horovod's own MNIST example evaluates so, without ``torch.no_grad()``."""
    escapes = _Escapes()
    function.body.visit(escapes)
    return not escapes.found


def _enclosing_for(node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> Optional[cst.For]:
    while node in parents:
        node = parents[node]
        if isinstance(node, cst.For):
            return node
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
    return None


def _contains(stmt: cst.CSTNode, node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    while node in parents:
        if node is stmt:
            return True
        node = parents[node]
    return node is stmt


def plan_accumulation(
    passes: str,
    optimizer: str,
    model_calls: List[cst.Name],
    parents: Mapping[cst.CSTNode, cst.CSTNode],
) -> Union[Accumulation, str]:
    """The loop to wrap, or the reason (for the TODO) why the loop shape is not the provable one."""
    why = (
        f"backward_passes_per_step={passes}: DDP needs `with ddp_model.no_sync():` around all but the "
        "last backward() of every group; the rewriter only does that for "
        f"`for i, ... in enumerate(...)` with `if (i + 1) % {passes} == 0: {optimizer}.step()`"
    )
    training_calls = [n for n in model_calls if not _inside_no_grad(n, parents)]
    loops = {_enclosing_for(n, parents) for n in training_calls}
    if len(loops) != 1 or None in loops:
        return why + " (the model's training forward calls are not all in one such loop)"
    loop = loops.pop()
    assert loop is not None
    sub_batches = _plan_sub_batches(loop, optimizer, training_calls, parents)
    if isinstance(sub_batches, Accumulation):
        return sub_batches
    target, it = loop.target, loop.iter
    if not (
        isinstance(target, cst.Tuple)
        and target.elements
        and isinstance(target.elements[0].value, cst.Name)
        and isinstance(it, cst.Call)
        and isinstance(it.func, cst.Name)
        and it.func.value == "enumerate"
        and len(it.args) == 1
        and it.args[0].keyword is None
        and it.args[0].star == ""
        and isinstance(loop.body, cst.IndentedBlock)
        and loop.orelse is None
    ):
        return why
    index = target.elements[0].value.value
    condition = f"({index}+1)%{passes}==0"
    body = list(loop.body.body)
    gates = [
        (k, s) for k, s in enumerate(body)
        if isinstance(s, cst.If) and _squash(code_of(s.test)) == condition
    ]
    if len(gates) != 1 or gates[0][1].orelse is not None:
        return why
    gate_index, gate = gates[0]
    loop_code, gate_code = code_of(loop), code_of(gate)
    step = f"{optimizer}.step("
    if loop_code.count(step) != 1 or gate_code.count(step) != 1:
        return why + f" (`{optimizer}.step()` must be called once, inside that `if`)"
    if loop_code.count("zero_grad(") != gate_code.count("zero_grad("):
        return why + " (zero_grad() outside that `if` would drop the accumulated gradients)"
    backward = [k for k, s in enumerate(body) if ".backward(" in code_of(s)]
    if loop_code.count(".backward(") != 1 or len(backward) != 1 or backward[0] > gate_index:
        return why + " (the loop must call backward() exactly once, before the `if`)"
    count = backward[0] + 1
    wrapped = body[:count]
    if not all(any(_contains(s, n, parents) for s in wrapped) for n in training_calls):
        return why + " (a forward call of the model comes after backward())"
    return Accumulation(loop, count, code_of(gate.test).strip())


class _Bound(cst.CSTVisitor):
    """Names assigned anywhere in a subtree."""

    def __init__(self) -> None:
        self.names: set = set()

    def visit_Name(self, node: cst.Name) -> None:
        pass

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.names |= {n.value for n in _names_in(node.target)}

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.names |= {n.value for n in _names_in(node.target)}

    def visit_For(self, node: cst.For) -> None:
        self.names |= {n.value for n in _names_in(node.target)}


def _names_in(node: cst.CSTNode) -> List[cst.Name]:
    found: List[cst.Name] = []

    class Collect(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.append(name)

    node.visit(Collect())
    return found


def reevaluable(node: cst.BaseExpression) -> bool:
    """A literal, a name, a chain of attributes and subscripts by literals (``self.cfg.accum``,
    ``cfg["train"]["accum_steps"]``), or ``len()`` of one: cheap and side-effect free, so it may be
    evaluated again where the rewrite needs it."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "len":
        return len(node.args) == 1 and node.args[0].star == "" and reevaluable(node.args[0].value)
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Subscript) and not (
                len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
                and isinstance(node.slice[0].slice.value, (cst.SimpleString, cst.Integer))):
            return False
        node = node.value
    return isinstance(node, (cst.Name, cst.Integer))


def _plan_sub_batches(
    loop: cst.For, optimizer: str, training_calls: List[cst.Name], parents: Mapping[cst.CSTNode, cst.CSTNode]
) -> Optional[Accumulation]:
    """The sub-batch shape (see the module docstring), or None when `loop` does not have it."""
    it, target = loop.iter, loop.target
    if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "range"
            and 1 <= len(it.args) <= 3 and all(a.keyword is None and a.star == "" for a in it.args)
            and isinstance(target, cst.Name) and isinstance(loop.body, cst.IndentedBlock)
            and loop.orelse is None):
        return None
    stop = it.args[0].value if len(it.args) == 1 else it.args[1].value
    step = it.args[2].value if len(it.args) == 3 else cst.Integer("1")
    if not (reevaluable(stop) and reevaluable(step)) or code_of(step).strip().startswith("-"):
        return None
    bound = _Bound()
    loop.body.visit(bound)
    if target.value in {n.value for n in _names_in(stop) + _names_in(step)} or bound.names & {
            n.value for n in _names_in(stop) + _names_in(step)}:
        return None
    block = parents.get(loop)
    body = list(getattr(block, "body", ()))
    if loop not in body:
        return None
    after = body[body.index(loop) + 1:]
    step_call = f"{optimizer}.step("
    function = loop
    while function in parents and not isinstance(function, (cst.FunctionDef, cst.Module)):
        function = parents[function]
    function_code = code_of(function)
    # step() follows in the same block; what comes between may not run backward() (checked below:
    # the function has one) -- e.g. Horovod's elastic example records the sampler's progress there.
    steps = [st for st in after if step_call in code_of(st)]
    if not (steps and isinstance(steps[0], cst.SimpleStatementLine) and function_code.count(step_call) == 1):
        return None
    inner = list(loop.body.body)
    loop_code = code_of(loop)
    backward = [k for k, st in enumerate(inner) if ".backward(" in code_of(st)]
    if (function_code.count(".backward(") != 1 or len(backward) != 1 or "zero_grad(" in loop_code
            or step_call in loop_code):
        return None
    count = backward[0] + 1
    if not all(any(_contains(st, n, parents) for st in inner[:count]) for n in training_calls):
        return None
    last = f"{target.value} + {code_of(step).strip()} >= {code_of(stop).strip()}"
    return Accumulation(loop, count, last)
