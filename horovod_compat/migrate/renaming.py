"""Names the native code needs that the input binds to something else (``import
pyro.distributions as dist``): the input's binding is set aside while the rewrite runs, and
afterwards the native code's name becomes a free one (``torch_dist``) and the input's comes back
to the letter (`engine.migrate_units` runs the rewrite again with `set_aside`)."""
from __future__ import annotations

from typing import Dict, Mapping, Set, Tuple

import libcst as cst

#: The name native code takes when the input binds the usual one to something else.
_ALTERNATIVES = {"dist": "torch_dist", "DDP": "TorchDDP", "os": "os_", "torch": "torch_"}
#: The input's own binding of a clashing name while the rewrite runs (restored after it); an
#: ``import x`` of the input is set aside as ``import x as <_IMPORTED_ASIDE>``.
_SET_ASIDE = "_horovod_compat_user_{}"
_IMPORTED_ASIDE = "_horovod_compat_user_import_{}"


def _name_of(node: cst.BaseExpression) -> str:
    return node.value if isinstance(node, cst.Name) else ""


def free_name(name: str, taken: Set[str]) -> str:
    base = _ALTERNATIVES.get(name, f"{name}_")
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}{n}"
    return candidate


class Rename(cst.CSTTransformer):
    """Rename identifiers by `mapping` at once (a swap works): names and ``as`` names, never an
    attribute, a keyword argument or a module path in an import. An ``import os`` whose name
    changes becomes ``import os as <new>``."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.mapping = mapping

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.mapping.get(original_node.value)
        return updated_node.with_changes(value=new) if new else updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_ImportAlias(self, original_node: cst.ImportAlias,
                          updated_node: cst.ImportAlias) -> cst.ImportAlias:
        name = original_node.name
        kept = updated_node.with_changes(name=name)
        if original_node.asname is None and isinstance(name, cst.Name) and name.value in self.mapping:
            new = self.mapping[name.value]
            if new.startswith(_SET_ASIDE.format("")):  # marked, so the way back drops it again
                new = _IMPORTED_ASIDE.format(name.value)
            return kept.with_changes(asname=cst.AsName(cst.Name(new)))
        before = original_node.asname.name if original_node.asname is not None else None
        if isinstance(before, cst.Name) and before.value == _IMPORTED_ASIDE.format(_name_of(name)):
            return kept.with_changes(asname=None)  # `import x` set aside, now back as it was
        return kept

    def leave_ImportFrom(self, original_node: cst.ImportFrom,
                         updated_node: cst.ImportFrom) -> cst.ImportFrom:
        return updated_node.with_changes(module=original_node.module)


def set_aside(renames: Mapping[str, str]) -> Tuple[Dict[str, str], Dict[str, str]]:
    """For {name: free name}: the renaming applied to the input before the rewrite, and the one
    applied to the output after it (the input's names back, the native code's to the free ones)."""
    aside = {name: _SET_ASIDE.format(name) for name in renames}
    back = {**{v: k for k, v in aside.items()},
            **{_IMPORTED_ASIDE.format(k): k for k in renames}, **renames}
    return aside, back
