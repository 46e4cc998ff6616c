"""Simple data flow for Horovod constants chosen at run time.

Real scripts rarely write ``compression=hvd.Compression.fp16``; they write::

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(..., compression=compression,
                                   op=hvd.Adasum if args.use_adasum else hvd.Average)

A *choice* is an expression whose every outcome is a Horovod constant: the constant itself, or a
conditional expression (``a if c else b``, nested) over choices.  An argument is understood when it
is a choice written in place, a plain name whose every binding in the same scope is an
assignment of a choice (one binding, or one per branch of an ``if``) and whose only use is that
argument, or a lookup in a *table*: a name bound once to a dict literal of constants and only ever
read by subscript (``COMPRESSIONS = {"none": hvd.Compression.none, "fp16": ...}`` and
``compression=COMPRESSIONS[cfg["compression"]]``).  The rewrite keeps the run-time decision:

* a choice written in place becomes the *condition* under which a given constant is picked
  (``args.use_adasum`` above), evaluated where the call was;
* a named choice keeps its name and its bindings, with each constant replaced in place by its
  native value (``default_hooks.fp16_compress_hook`` / ``None``), so the decision is still made
  where the script made it;
* a lookup by a literal key is the constant it finds; a lookup by a run-time key keeps the lookup,
  which holds the native values once the whole file is native (rules/constants.py rewrites the
  table then, since other code may read it too).
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Dict, List, Mapping, Optional, Set, Union

import libcst as cst
from libcst.metadata import Scope

from horovod_compat.migrate.context import code_of, hvd_attr_name


@dataclasses.dataclass
class Choice:
    """A run-time choice among Horovod constants.

    `leaves` maps each constant node to its Horovod name (``"Compression.fp16"``); `tree` is the
    expression (in place) or, for a named choice, None; `name` is the variable for a named choice.
    """

    leaves: Dict[cst.Attribute, str]
    tree: Optional[cst.BaseExpression] = None
    name: Optional[str] = None
    #: The leaves are a table's values: not rewritten by the caller (constants.py does that).
    table: bool = False
    #: The source of a table lookup by a run-time key (then `tree` and `name` are None).
    lookup: Optional[str] = None

    @property
    def constants(self) -> Set[str]:
        """The Horovod constants that can be chosen."""
        return set(self.leaves.values())


def _tree_leaves(node: cst.BaseExpression, aliases: Set[str]) -> Optional[Dict[cst.Attribute, str]]:
    """The constant leaves of a conditional-expression tree, or None when a leaf is not one."""
    if isinstance(node, cst.IfExp):
        body = _tree_leaves(node.body, aliases)
        orelse = _tree_leaves(node.orelse, aliases)
        return None if body is None or orelse is None else {**body, **orelse}
    name = hvd_attr_name(node, aliases)
    if name is None or not isinstance(node, cst.Attribute):
        return None
    return {node: name}


def resolve(
    value: cst.BaseExpression,
    aliases: Set[str],
    scope: Optional[Scope],
    parents: Mapping[cst.CSTNode, cst.CSTNode],
    all_native: bool = False,
) -> Union[Choice, str, None]:
    """The Choice `value` makes; a reason (str) when it is a name the rewriter cannot follow;
    None when `value` is neither a choice nor a name (the caller judges it as written).

    A named choice may be read elsewhere too (``logger.info(f"{compression}")``) when `all_native`:
    every Horovod constant of the file then becomes its native value, so those reads see the
    same values as the call; not when a read uses the value's attributes or calls it
    (``compression.compress(t)``: Horovod's compressor API)."""
    leaves = _tree_leaves(value, aliases)
    if leaves is not None:
        return Choice(leaves, tree=value)
    if isinstance(value, cst.Subscript) and scope is not None:
        return _lookup(value, aliases, scope, parents)
    if not isinstance(value, cst.Name) or scope is None:
        return None
    name = value.value
    assignments = [a for a in scope[name] if hasattr(a, "node")]
    if not assignments:
        return f"`{name}` is not bound in this scope"
    found: Dict[cst.Attribute, str] = {}
    for assignment in assignments:
        if assignment.scope is not scope:
            return f"`{name}` is bound in another scope"
        target = assignment.node
        assign = parents.get(target) and parents.get(parents.get(target))
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.targets[0].target is target):
            return f"`{name}` is bound by something other than a plain assignment"
        leaves = _tree_leaves(assign.value, aliases)
        if leaves is None:
            return f"`{name}` is assigned `{code_of(assign.value).strip()}`, not a Horovod constant"
        found.update(leaves)
        for access in assignment.references:
            if access.node is value:
                continue
            if not all_native:
                return f"`{name}` is used elsewhere too; the rewriter only follows a name used once"
            if _used_as_object(access.node, parents):
                return f"`{name}` is used as Horovod's compressor or op object elsewhere (an attribute or a call)"
    return Choice(found, name=name)


def _used_as_object(node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """`node` has an attribute read (``c.compress``) or is called (``c(...)``)."""
    parent = parents.get(node)
    return (isinstance(parent, cst.Attribute) and parent.value is node) or (
        isinstance(parent, cst.Call) and parent.func is node)


def _lookup(
    value: cst.Subscript,
    aliases: Set[str],
    scope: Scope,
    parents: Mapping[cst.CSTNode, cst.CSTNode],
) -> Union[Choice, str, None]:
    """The Choice of ``TABLE[key]`` (see the module docstring), a reason, or None when `value` is
    not a one-key lookup in a name."""
    if not (isinstance(value.value, cst.Name) and len(value.slice) == 1
            and isinstance(value.slice[0].slice, cst.Index)):
        return None
    name, key = value.value.value, value.slice[0].slice.value
    assignments = [a for a in scope[name] if hasattr(a, "node")]
    if len(assignments) != 1:
        return f"`{name}` is not bound once"
    target = assignments[0].node
    assign = parents.get(target) and parents.get(parents.get(target))
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.targets[0].target is target
            and isinstance(assign.value, cst.Dict)):
        return f"`{name}` is not a dict literal of Horovod constants"
    table: Dict[str, cst.Attribute] = {}
    for element in assign.value.elements:
        leaf = element.value if isinstance(element, cst.DictElement) else None
        found = _tree_leaves(leaf, aliases) if isinstance(leaf, cst.Attribute) else None
        if found is None or not isinstance(element.key, (cst.SimpleString, cst.Integer)):
            return f"`{name}` is not a dict literal of Horovod constants with literal keys"
        table[repr(ast.literal_eval(element.key.value))] = leaf
    for access in assignments[0].references:
        read = parents.get(access.node)
        if not (isinstance(read, cst.Subscript) and read.value is access.node) or isinstance(
                parents.get(read), (cst.AssignTarget, cst.Del)) or (
                isinstance(parents.get(read), cst.AugAssign) and parents[read].target is read):
            return f"`{name}` is used otherwise than read by a key, so it may change"
    leaves = {leaf: hvd_attr_name(leaf, aliases) or "" for leaf in table.values()}
    if isinstance(key, (cst.SimpleString, cst.Integer)):
        leaf = table.get(repr(ast.literal_eval(key.value)))
        if leaf is None:
            return f"`{name}` has no key {key.value}"
        return Choice({leaf: leaves[leaf]}, tree=leaf, table=True)
    return Choice(leaves, table=True, lookup=code_of(value).strip())


def condition(tree: cst.BaseExpression, chosen: Set[str], leaves: Mapping[cst.Attribute, str]) -> str:
    """Python source, true exactly when evaluating `tree` picks one of the `chosen` constants.

    Folds constant branches: ``"True"`` / ``"False"`` when the answer does not depend on a test.
    """
    if isinstance(tree, cst.IfExp):
        test = code_of(tree.test).strip()
        yes = condition(tree.body, chosen, leaves)
        no = condition(tree.orelse, chosen, leaves)
        if yes == no:
            return yes
        if (yes, no) == ("True", "False"):
            return test if _atomic(tree.test) else f"({test})"
        if (yes, no) == ("False", "True"):
            return f"not {test}" if _atomic(tree.test) else f"not ({test})"
        parts: List[str] = []
        wrapped = test if _atomic(tree.test) else f"({test})"
        if yes != "False":
            parts.append(wrapped if yes == "True" else f"({wrapped} and {yes})")
        if no != "False":
            parts.append(f"not {wrapped}" if no == "True" else f"(not {wrapped} and {no})")
        return " or ".join(parts)
    assert isinstance(tree, cst.Attribute)
    return "True" if leaves[tree] in chosen else "False"


def _atomic(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not node.lpar

