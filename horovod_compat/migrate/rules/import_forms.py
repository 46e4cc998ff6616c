"""Horovod imported in another form than ``import horovod.torch as hvd``: brought to that form
before the rewrite, so every rule sees ``hvd.X``.

Real programs write ``from horovod.torch import allreduce, Average``, ``import
horovod.torch.mpi_ops as mpi_ops``, ``from horovod.torch.functions import
broadcast_parameters`` or ``from horovod.common.exceptions import HorovodInternalError``;
``from horovod import run`` (or ``__version__``) is brought to ``import horovod`` and
``horovod.run``, and ``import horovod.torch`` used as ``horovod.torch.init()`` to ``hvd.init()``.
Each of those names is one that ``horovod.torch`` itself exports (Horovod 0.28.1's
``horovod/torch/__init__.py`` re-exports them from these submodules), so ``allreduce`` is
``hvd.allreduce`` and ``mpi_ops.allreduce`` is too. A form is brought over only when that is
certain: the name is bound once in its scope (by that import), and a submodule's alias is only
ever used as ``alias.NAME`` with NAME exported by ``horovod.torch``. Anything else stays as it is
and keeps its TODO (``imports.unsupported_import``). A module-level importer's call,
``hvd = LazyImport("horovod.torch")`` or ``importlib.import_module(...)``, bound once and used
only as ``hvd.NAME``, is brought to the import too.

Trainer classes and backends hold the module in an attribute: ``self.hvd = hvd`` after a local
``import horovod.torch as hvd``, or ``self._hvd = importlib.import_module("horovod.torch")``.
Such an attribute is followed when every store to it (on any object) is the module or ``None``
and every other use of it is ``X.attr.NAME`` with NAME exported by ``horovod.torch``: each use
becomes ``hvd.NAME`` and each store of the module ``import horovod.torch as hvd`` (removed with
the other imports once no use is left). The rewritten uses name ``hvd`` where only the method
that stored it may bind it, so the engine keeps this form only when the rewrite leaves no
Horovod use behind (``engine.migrate_units``).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, ScopeProvider

from horovod_compat.migrate.context import HVD_NAMES, HVD_SUBMODULES, SharedState
from horovod_compat.migrate.rules.imports import ImportScan, alias_bound, dotted_name

HVD_MODULE = "horovod.torch"
EXCEPTIONS_MODULE = "horovod.common.exceptions"


class _Plan(cst.CSTVisitor):
    """Which import aliases go, and what each use of their names becomes (``hvd.X``)."""

    METADATA_DEPENDENCIES = (ScopeProvider, ParentNodeProvider)

    def __init__(self, hvd: str, elsewhere: Set[str], optimizer_class: Optional[str] = None) -> None:
        self.hvd = hvd
        self.elsewhere = elsewhere  # names used in the input's other units (notebook cells)
        #: how this module spells torch's Optimizer class, if it imports it or torch
        self.optimizer_class = optimizer_class
        self.uses: Dict[cst.CSTNode, Tuple[str, str]] = {}  # Name/Attribute node -> (module, X)
        #: Name node -> the expression it becomes (a type annotation of Horovod's private class)
        self.annotations: Dict[cst.Name, str] = {}
        self.dropped: Set[cst.ImportAlias] = set()
        #: import statements that lost an alias -> the module they import instead
        self.statements: Dict[cst.CSTNode, str] = {}
        #: ``hvd = LazyImport("horovod.torch")`` statements, each to become the import
        self.assigned: Set[cst.Assign] = set()

    def _references(self, stmt: cst.CSTNode, name: str) -> Optional[List[cst.Name]]:
        """Every use of `name` as bound by `stmt`, or None if `name` is bound more than once
        in that scope (then it may mean something else at some use)."""
        scope = self.get_metadata(ScopeProvider, stmt, None)
        if scope is None or name in self.elsewhere:
            return None
        assignments = list(scope.assignments[name])
        if len(assignments) != 1:
            return None
        return [access.node for access in assignments[0].references if isinstance(access.node, cst.Name)]

    def _names_from(self, stmt: cst.ImportFrom, alias: cst.ImportAlias, exported: str,
                    module: str = HVD_MODULE) -> None:
        bound = alias_bound(alias)
        refs = self._references(stmt, bound) if bound else None
        if refs is None:
            return
        for ref in refs:
            self.uses[ref] = (module, exported)
        self.dropped.add(alias)
        self.statements[stmt] = module

    def _annotation(self, stmt: cst.ImportFrom, alias: cst.ImportAlias) -> None:
        """``from horovod.torch.optimizer import _DistributedOptimizer`` used only in type
        annotations: each becomes torch's Optimizer, the class of the optimizer once migrated (a
        base class keeps the import and its TODO: there is no native class to derive from)."""
        bound = alias_bound(alias)
        refs = self._references(stmt, bound) if bound and self.optimizer_class else None
        if not refs:
            return
        for ref in refs:
            node: Optional[cst.CSTNode] = ref
            while node is not None and not isinstance(node, cst.Annotation):
                node = self.get_metadata(ParentNodeProvider, node, None)
            if node is None:
                return  # used otherwise than in an annotation: leave it
        self.annotations.update(dict.fromkeys(refs, self.optimizer_class))
        self.dropped.add(alias)
        self.statements[stmt] = HVD_MODULE

    def _submodule(self, stmt: Union[cst.Import, cst.ImportFrom], alias: cst.ImportAlias) -> None:
        bound = alias_bound(alias)
        refs = self._references(stmt, bound) if bound else None
        if refs is not None:
            self._bring_over(stmt, alias, refs)

    def _package(self, stmt: cst.Import, alias: cst.ImportAlias) -> None:
        """``import horovod.torch`` (which binds ``horovod``) used only as
        ``horovod.torch.NAME``. (The scopes hold ``horovod.torch.X`` as a use of
        ``horovod.torch``, and any other use of ``horovod`` as one of ``horovod``: there must be
        none of those.)"""
        scope = self.get_metadata(ScopeProvider, stmt, None)
        if scope is None or "horovod" in self.elsewhere:
            return
        package, top = list(scope.assignments[HVD_MODULE]), list(scope.assignments["horovod"])
        if len(package) != 1 or len(top) != 1 or any(True for _ in top[0].references):
            return
        self._bring_over(stmt, alias, [access.node for access in package[0].references])

    def _bring_over(self, stmt: Union[cst.Import, cst.ImportFrom, cst.Assign], alias: Optional[cst.ImportAlias],
                    refs: Sequence[cst.CSTNode]) -> None:
        """`alias` goes and each of `refs` (a submodule's alias, or ``horovod.torch``) with it,
        each ``ref.NAME`` becoming ``hvd.NAME``, if every ref is used that way with NAME exported
        by ``horovod.torch``; else nothing changes."""
        attributes = []
        for ref in refs:
            parent = self.get_metadata(ParentNodeProvider, ref, None)
            if not (isinstance(parent, cst.Attribute) and parent.value is ref
                    and parent.attr.value in HVD_NAMES):
                return  # used otherwise than as ref.NAME: leave it
            attributes.append(parent)
        for attribute in attributes:
            self.uses[attribute] = (HVD_MODULE, attribute.attr.value)
        if alias is None:
            self.assigned.add(stmt)
            return
        self.dropped.add(alias)
        self.statements[stmt] = HVD_MODULE

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        for alias in node.names:
            name = dotted_name(alias.name)
            if module == HVD_MODULE and name in HVD_NAMES - {"elastic"}:
                self._names_from(node, alias, name)
            elif module == HVD_MODULE and name in HVD_SUBMODULES:
                self._submodule(node, alias)
            elif module.startswith(HVD_MODULE + ".") and module.split(".")[-1] in HVD_SUBMODULES \
                    and name in HVD_NAMES:
                self._names_from(node, alias, name)
            elif module == EXCEPTIONS_MODULE and name == "HorovodInternalError":
                self._names_from(node, alias, name)  # horovod.torch re-exports it
            elif module == HVD_MODULE + ".optimizer" and name == "_DistributedOptimizer":
                self._annotation(node, alias)
            elif module == "horovod" and name in ("run", "__version__"):
                self._names_from(node, alias, name, module="horovod")  # -> horovod.run(...), ...

    def visit_Assign(self, node: cst.Assign) -> None:
        """``hvd = LazyImport("horovod.torch")``, bound once and used only as ``hvd.NAME``:
        it becomes ``import horovod.torch as hvd``."""
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name) \
                or not _imports_module(node.value):
            return
        refs = self._references(node, node.targets[0].target.value)
        if refs is not None:
            self._bring_over(node, None, refs)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted_name(alias.name)
            if alias.asname is not None and name.startswith(HVD_MODULE + ".") \
                    and name.split(".")[-1] in HVD_SUBMODULES and name.count(".") == 2:
                self._submodule(node, alias)
            elif alias.asname is None and name == HVD_MODULE:
                self._package(node, alias)


def _imports_module(value: cst.BaseExpression) -> bool:
    """``importlib.import_module("horovod.torch")``, or another importer's call with that one
    argument (``LazyImport("horovod.torch")``, ``lazy_import(...)``: a callee whose name says
    import, not ``__import__``, which returns the top package)."""
    if not (isinstance(value, cst.Call) and len(value.args) == 1 and value.args[0].keyword is None
            and isinstance(value.args[0].value, cst.SimpleString)
            and value.args[0].value.evaluated_value == HVD_MODULE):
        return False
    callee = dotted_name(value.func).split(".")[-1] if isinstance(value.func, (cst.Name, cst.Attribute)) else ""
    return "import" in callee.lower() and callee != "__import__"


def _stores_module(value: cst.BaseExpression, hvd: str) -> bool:
    """``hvd`` (the module's alias) or a call that imports ``horovod.torch`` (`_imports_module`)."""
    if isinstance(value, cst.Name):
        return value.value == hvd
    return _imports_module(value)


class _Held(cst.CSTVisitor):
    """Attributes that hold ``horovod.torch`` (see the module docstring): the stores of the
    module to replace and the ``X.attr.NAME`` uses to bring to ``hvd.NAME``."""

    METADATA_DEPENDENCIES = (ParentNodeProvider,)

    def __init__(self, hvd: str, elsewhere: Set[str]) -> None:
        self.hvd = hvd
        self.elsewhere = elsewhere
        self.stores: Dict[str, List[cst.Assign]] = {}
        self.uses: Dict[str, List[cst.Attribute]] = {}
        #: attribute names stored or used otherwise: not followed
        self.spoiled: Set[str] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if not isinstance(target.target, cst.Attribute):
                continue
            name = target.target.attr.value
            if len(node.targets) == 1 and _stores_module(node.value, self.hvd):
                self.stores.setdefault(name, []).append(node)
            elif not (isinstance(node.value, cst.Name) and node.value.value == "None"):
                self.spoiled.add(name)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.AssignTarget) and isinstance(self.get_metadata(ParentNodeProvider, parent, None),
                                                               cst.Assign):
            return  # (visit_Assign judges the store)
        name = node.attr.value
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in HVD_NAMES:
            self.uses.setdefault(name, []).append(parent)
        else:
            self.spoiled.add(name)

    def followed(self) -> Tuple[Dict[cst.Attribute, Tuple[str, str]], Set[cst.Assign]]:
        """({use: (module, NAME)}, stores of the module) of the attributes followed."""
        uses: Dict[cst.Attribute, Tuple[str, str]] = {}
        stores: Set[cst.Assign] = set()
        for name, assigns in self.stores.items():
            if name in self.spoiled or name in self.elsewhere:
                continue
            stores.update(assigns)
            uses.update({use: (HVD_MODULE, use.attr.value) for use in self.uses.get(name, ())})
        return uses, stores


class _Apply(cst.CSTTransformer):
    def __init__(self, plan: _Plan, stores: Set[cst.Assign] = frozenset()) -> None:
        self.plan = plan
        self.stores = stores

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign
                     ) -> Union[cst.Assign, cst.Import]:
        if original_node not in self.stores and original_node not in self.plan.assigned:
            return updated_node
        return cst.Import([cst.ImportAlias(cst.parse_expression(HVD_MODULE),  # type: ignore[arg-type]
                                           asname=cst.AsName(cst.Name(self.plan.hvd)))])

    def _bound(self, module: str) -> str:
        return self.plan.hvd if module == HVD_MODULE else module

    def _use(self, use: Tuple[str, str]) -> cst.Attribute:
        return cst.Attribute(cst.Name(self._bound(use[0])), cst.Name(use[1]))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node in self.plan.annotations:
            return cst.parse_expression(self.plan.annotations[original_node])
        use = self.plan.uses.get(original_node)
        return self._use(use) if use is not None else updated_node

    def leave_Attribute(self, original_node: cst.Attribute,
                        updated_node: cst.Attribute) -> cst.BaseExpression:
        use = self.plan.uses.get(original_node)
        if use is None:
            return updated_node
        return self._use(use).with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
                         ) -> Union[cst.ImportFrom, cst.Import]:
        return self._rebuilt(original_node, updated_node)

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
        # (a repeated canonical import stays: removing the line would shift the line numbers
        # the report gives; the import fix-up removes every one once no use is left)
        return self._rebuilt(original_node, updated_node)

    def _rebuilt(self, original: Union[cst.Import, cst.ImportFrom],
                 updated: Union[cst.Import, cst.ImportFrom]) -> Union[cst.Import, cst.ImportFrom]:
        if original not in self.plan.statements:
            return updated
        kept = [a for a, o in zip(updated.names, original.names) if o not in self.plan.dropped]
        module = self.plan.statements[original]
        asname = cst.AsName(cst.Name(self.plan.hvd)) if module == HVD_MODULE else None
        canonical = cst.Import([cst.ImportAlias(cst.parse_expression(module),  # type: ignore[arg-type]
                                                asname=asname)])
        if not kept:
            return canonical
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=kept)


def _hvd_name(module: cst.Module, taken: Set[str]) -> str:
    """The input's own name for ``horovod.torch``, else ``hvd`` (or ``hvd2``, ... when taken)."""
    scan = ImportScan(SharedState())
    module.visit(scan)
    if scan.shared.hvd_aliases:
        return sorted(scan.shared.hvd_aliases)[0]
    name, n = "hvd", 1
    while name in taken:
        n += 1
        name = f"hvd{n}"
    return name


def normalize(wrapper: MetadataWrapper, taken: Set[str], elsewhere: Set[str], held: bool = True
              ) -> Tuple[MetadataWrapper, bool]:
    """(`wrapper`'s module with the other Horovod import forms brought to ``import horovod.torch as
    hvd`` (see the module docstring), whether an attribute holding the module was followed). The
    wrapper is `wrapper` itself when nothing changes, so that the metadata resolved here serves
    the rewrite too. `taken`: names the input uses; `elsewhere`: names used in the input's other
    units, whose imports are left as they are; `held`: follow attributes that hold the module."""
    code = wrapper.module.code
    optimizer_class = "Optimizer" if re.search(r"^from torch\.optim import [^#\n]*\bOptimizer\b(?! as)", code, re.M) \
        else "torch.optim.Optimizer" if re.search(r"^import torch$", code, re.M) else None
    plan = _Plan(_hvd_name(wrapper.module, taken | elsewhere), elsewhere, optimizer_class)
    wrapper.visit(plan)
    stores: Set[cst.Assign] = set()
    if held and re.search(r"\bimport_module\b|^\s*import horovod\.torch as ", code, re.M):
        scan = _Held(plan.hvd, elsewhere)
        wrapper.visit(scan)
        uses, stores = scan.followed()
        plan.uses.update(uses)
    if not plan.dropped and not stores and not plan.assigned:
        return wrapper, False
    return MetadataWrapper(wrapper.module.visit(_Apply(plan, stores)), unsafe_skip_copy=True), bool(stores)
