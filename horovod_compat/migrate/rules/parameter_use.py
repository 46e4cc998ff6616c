"""Can the rewriter prove that every parameter of a model gets a gradient on every step?

DistributedDataParallel needs that: a parameter left without a gradient in one iteration stops
the next one ("Expected to have finished reduction in the prior iteration ..."), and with
``find_unused_parameters=True`` it stays without a gradient, so momentum and weight decay skip it.
Horovod's DistributedOptimizer averaged a zero gradient for it instead. The DDP rewrite is only
right where no parameter can be skipped; elsewhere the native optimizer helper keeps Horovod's
behaviour (optimizer_hooks.py).

The proof is deliberately narrow, and says why it fails:

* every forward call passes only the input (``model(x)``), or only positional inputs to a class
  of this file (``model(users, items)``, below): a keyword usually chooses what runs
  (``model(x, tasks=("cls",))``), and so may an extra argument where the rewriter cannot read the
  forward;
* the model is built from ``torch.nn`` layers (``nn.Sequential(nn.Linear(...), ...)``), a known
  single-output torchvision architecture, or a class of this file whose ``forward(self, x, ...)``
  takes plain positional inputs and is straight-line code (no branches, loops, comprehensions,
  short-circuit ``and``/``or``, ``with`` blocks, early returns, or submodules picked at run time
  from ``self.experts[i]`` / ``getattr``), so that no input can choose what runs, and uses every
  submodule and parameter its ``__init__`` assigns, recursively for the file's own classes among
  them.
"""
from __future__ import annotations

import ast
from typing import Dict, Iterable, Optional, Set

import libcst as cst

from horovod_compat.migrate.context import code_of

#: Methods that return the same module (moved or cast): ``Net().to(device)`` is still ``Net()``.
_SAME_MODULE = {"cuda", "cpu", "to", "half", "float", "double", "bfloat16", "train", "eval",
                "requires_grad_", "share_memory"}
#: torchvision architectures whose forward uses every parameter and returns one tensor in
#: training (inception_v3 and googlenet also return auxiliary logits: not listed).
_TORCHVISION = ("resnet", "resnext", "wide_resnet", "vgg", "alexnet", "mobilenet", "densenet",
                "squeezenet", "shufflenet", "efficientnet", "regnet", "convnext", "mnasnet")
_BRANCHING = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.IfExp, ast.ListComp,
              ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda, ast.With, ast.AsyncWith,
              ast.BoolOp)


def _classes(module_code: str) -> Dict[str, ast.ClassDef]:
    try:
        tree = ast.parse(module_code)
    except SyntaxError:
        return {}
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _method(cls: ast.ClassDef, name: str) -> Optional[ast.FunctionDef]:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _self_attributes(node: ast.AST) -> Set[str]:
    return {n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _class_reason(name: str, classes: Dict[str, ast.ClassDef], seen: Set[str]) -> Optional[str]:
    """Why class `name` of this file may leave a parameter without a gradient; None if it cannot."""
    if name in seen:
        return None
    seen.add(name)
    cls = classes[name]
    forward = _method(cls, "forward")
    if forward is None:
        return f"`{name}` has no forward() of its own"
    args = forward.args
    if len(args.args) < 2 or args.vararg or args.kwarg or args.kwonlyargs or args.defaults:
        return f"`{name}.forward` takes more than plain positional inputs"
    for stmt in forward.body[:-1]:
        if any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            return f"`{name}.forward` returns early"
    for node in ast.walk(forward):
        if isinstance(node, _BRANCHING):
            return f"`{name}.forward` branches or loops (line {node.lineno})"
        if isinstance(node, ast.Attribute) and node.attr in ("detach", "no_grad", "detach_"):
            return f"`{name}.forward` detaches part of the graph (line {node.lineno})"
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "self":
            return f"`{name}.forward` picks from `self.{node.value.attr}[...]` (line {node.lineno})"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            return f"`{name}.forward` looks a submodule up by name (line {node.lineno})"
    used = _self_attributes(forward)
    init = _method(cls, "__init__")
    for node in ast.walk(init) if init is not None else ():
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id == "self" and target.attr not in used:
                return f"`{name}.forward` does not use `self.{target.attr}`"
        callee = node.value.func
        if isinstance(callee, ast.Name) and callee.id in classes:
            reason = _class_reason(callee.id, classes, seen)
            if reason:
                return reason
    return None


def _built(value: cst.BaseExpression) -> cst.BaseExpression:
    """`value` less the calls that return the same module: ``Net().to(device)`` -> ``Net()``."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value in _SAME_MODULE:
        value = value.func.value
    return value


def _builder_reason(value: cst.BaseExpression, classes: Dict[str, ast.ClassDef], seen: Set[str]) -> Optional[str]:
    """Why the module `value` builds may leave a parameter without a gradient; None if it cannot."""
    value = _built(value)
    if not isinstance(value, cst.Call):
        return f"`{code_of(value).strip()}` is not a model built here"
    func = code_of(value.func).strip()
    head, _, last = func.rpartition(".")
    if not head and last in classes:
        return _class_reason(last, classes, seen)
    if head in ("nn", "torch.nn"):
        if last != "Sequential":
            return None  # a torch.nn layer uses its parameters
        for arg in value.args:
            reason = _builder_reason(arg.value, classes, seen) if arg.keyword is None and not arg.star \
                else f"`{func}` with {code_of(arg).strip()}"
            if reason:
                return reason
        return None
    if head.endswith("models") and last.startswith(_TORCHVISION):
        return None
    return f"`{func}(...)` is not a model the rewriter can read"


def every_parameter_used(model: str, values: Iterable[cst.BaseExpression], forward_calls: Iterable[cst.Call],
                         lines: Dict[cst.Call, int], module_code: str) -> Optional[str]:
    """None when every parameter of `model` (bound to `values`, called as `forward_calls`) gets a
    gradient on every step; otherwise why that cannot be proven (the DDP rewrite's TODO reason)."""
    classes = _classes(module_code)
    own_class = all(isinstance(v, cst.Call) and code_of(_built(v).func).strip() in classes for v in values)
    for call in forward_calls:
        if not call.args or any(a.keyword is not None or a.star for a in call.args) \
                or len(call.args) > 1 and not own_class:
            return (f"`{model}(...)` at line {lines[call]} passes more than the input, which may choose "
                    "what runs: DDP refuses a step that leaves a parameter without a gradient "
                    "(Horovod averaged a zero gradient for it)")
    for value in values:
        reason = _builder_reason(value, classes, set())
        if reason:
            return (f"cannot prove every parameter of `{model}` gets a gradient on every step ({reason}); "
                    "DDP refuses a step that leaves one without (Horovod averaged a zero gradient)")
    return None
