"""Where a program reads gradients (``p.grad``, ``clip_grad_norm_``) relative to its backward passes
and optimizer steps, for the DistributedOptimizer rewrite.

Horovod's optimizer averages the gradients in ``step()`` (or ``synchronize()``); DDP has averaged
them when ``backward()`` returns. So where a read sits decides whether DDP changes what it sees:

- ``AFTER_STEP``: a statement after a ``step()`` of an optimizer in its block (or in an enclosing
  one): averaged under both (a gradient-norm metric logged after the step);
- ``BETWEEN``: after a ``backward()`` and before the ``step()`` that follows it in its block (or in
  the code that calls its function from there), typically ``clip_grad_norm_``. Without
  ``synchronize()`` Horovod's docs call this a bug: the read races the averaging. Under DDP it sees
  averaged gradients, which is what those docs ask for (``synchronize()`` first). The rewrite goes
  ahead and names the difference at the line;
- ``UNPROVEN``: anywhere else (a function called from where the rewriter cannot tell): the
  rewrite keeps its TODO.

A step is ``<receiver>.step(`` whose receiver's last name has ``opt`` in it (``optimizer``,
``self.opt``, not a scheduler), or ``scaler.step(optimizer)``. Reads inside a class that defines
an optimizer are not counted: its ``step()`` runs after the averaging under both.
"""
from __future__ import annotations

import dataclasses
import enum
import re
from typing import List, Mapping, Optional

import libcst as cst
from libcst.metadata import CodeRange

from horovod_compat.migrate.context import code_of

#: a clip_grad_* call (not its import, nor a variable named after it) or `.grad` (not `.grad(`:
#: torch.autograd.grad, a function)
_READ = re.compile(r"clip_grad_\w+(?=\s*\()|\.grad\b(?![_(])")
#: After a clip_grad_* name: its call's first argument, a module's parameters()
_CLIPPED = re.compile(r"\s*\(\s*([\w.]+)\.parameters\(\)")
_STEP = re.compile(r"\w*opt\w*(?:\[[^\]\n]*\])?\.step\(|\.step\(\s*(?:self\.)?\w*opt")
_BACKWARD = re.compile(r"\bbackward\(")
#: A base class that makes a class an optimizer: ``Optimizer``, ``torch.optim.Optimizer``,
#: ``optim.SGD`` (any of torch.optim's).
_OPTIMIZER_BASE = re.compile(r"^(?:(?:torch\.)?optim\.\w+|Optimizer)$")
#: The statements a read is placed by, and a comment can go above (transform.py's _COMPOUND too).
_STATEMENTS = (cst.SimpleStatementLine, cst.If, cst.For, cst.While, cst.With, cst.Try, cst.FunctionDef,
               cst.ClassDef)
#: How far the rewriter follows a read's function to the places that call it.
_CALLER_DEPTH = 2


class Where(enum.Enum):
    AFTER_STEP = "after a step()"
    BETWEEN = "between backward() and step()"
    UNPROVEN = "where the rewriter cannot place it"


@dataclasses.dataclass(frozen=True)
class Read:
    text: str
    line: int
    where: Where
    #: the statement the read is in (SimpleStatementLine or compound), for a comment above it
    statement: Optional[cst.CSTNode]
    #: the module whose gradients a clip reads (``clip_grad_norm_(flow.parameters(), ...)``), where
    #: it says; None for other reads
    module: Optional[str] = None


def gradient_reads(module_code: str, positions: Mapping[cst.CSTNode, CodeRange],
                   parents: Mapping[cst.CSTNode, cst.CSTNode]) -> List[Read]:
    """Every gradient read of the module (`module_code`: its source with comments blanked), placed."""
    statements = [(positions[n].start.line, positions[n].end.line, n) for n in parents
                  if isinstance(n, _STATEMENTS) and n in positions]
    optimizers = [(start, end) for start, end, n in statements if isinstance(n, cst.ClassDef)
                  and any(_OPTIMIZER_BASE.match(code_of(b.value).strip()) for b in n.bases)]
    reads = []
    for match in _READ.finditer(module_code):
        line = module_code.count("\n", 0, match.start()) + 1
        if any(start <= line <= end for start, end in optimizers):
            continue
        around = [(end - start, start, n) for start, end, n in statements if start <= line <= end]
        statement = min(around, key=lambda t: (t[0], -t[1]))[2] if around else None
        where = _place(statement, parents, positions, module_code, 0) if statement is not None else Where.UNPROVEN
        clipped = _CLIPPED.match(module_code, match.end())
        reads.append(Read(match.group(0), line, where, statement, clipped.group(1) if clipped else None))
    return reads


def _place(node: cst.CSTNode, parents, positions, module_code: str, depth: int) -> Where:
    while True:
        block = parents.get(node)
        if isinstance(block, (cst.IndentedBlock, cst.Module)) and node in block.body:
            body = list(block.body)
            before, after = body[:body.index(node)], body[body.index(node) + 1:]
            if any(_STEP.search(code_of(s)) for s in before):
                return Where.AFTER_STEP
            if any(_BACKWARD.search(code_of(s)) for s in before) and any(_STEP.search(code_of(s)) for s in after):
                return Where.BETWEEN
            owner = parents.get(block)
        else:
            owner = block
        if owner is None or isinstance(owner, (cst.Module, cst.ClassDef, cst.Lambda)):
            return Where.UNPROVEN
        if isinstance(owner, cst.FunctionDef):
            return _place_calls(owner, parents, positions, module_code, depth)
        node = owner


def _place_calls(function: cst.FunctionDef, parents, positions, module_code: str, depth: int) -> Where:
    """Where the calls of `function` are: the read inside it is there too (a function whose every
    call is after a step reads averaged gradients)."""
    if depth >= _CALLER_DEPTH:
        return Where.UNPROVEN
    name = function.name.value
    span = (positions[function].start.line, positions[function].end.line)
    calls = [n for n in parents if isinstance(n, cst.Call) and n in positions
             and (isinstance(n.func, cst.Name) and n.func.value == name
                  or isinstance(n.func, cst.Attribute) and n.func.attr.value == name)
             and not span[0] <= positions[n].start.line <= span[1]]
    method = isinstance(parents.get(parents.get(function)), cst.ClassDef)
    reference = rf"\b(?:self|cls)\.{re.escape(name)}\b" if method else rf"(?<![\w.]){re.escape(name)}\b"
    if not calls or re.search(reference + r"(?!\s*\()", module_code.replace(f"def {name}(", "")):
        return Where.UNPROVEN  # never called, or passed as a value (a callback)
    places = set()
    for call in calls:
        statement = call
        while statement is not None and not isinstance(statement, _STATEMENTS):
            statement = parents.get(statement)
        places.add(Where.UNPROVEN if statement is None
                   else _place(statement, parents, positions, module_code, depth + 1))
    if Where.UNPROVEN in places:
        return Where.UNPROVEN
    return Where.BETWEEN if Where.BETWEEN in places else Where.AFTER_STEP
