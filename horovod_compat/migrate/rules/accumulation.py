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

Every forward call of the model outside ``torch.no_grad()``/``torch.inference_mode()`` must be in
the wrapped statements.  Anything else stays a TODO.
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


def _inside_no_grad(node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, cst.With) and any(
            _squash(code_of(item.item)) in ("torch.no_grad()", "torch.inference_mode()") for item in node.items
        ):
            return True
    return False


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
