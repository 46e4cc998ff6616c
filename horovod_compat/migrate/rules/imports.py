"""Imports: find how Horovod is imported, then put the native imports where the old ones were.

New imports go right after the import they replace, in the same block: an ``import horovod.torch
as hvd`` inside a training function (what Databricks tells HorovodRunner users to do, so that the
function pickles) becomes ``import torch.distributed as dist`` inside that same function.  The old
import is removed only when no ``hvd.`` use is left anywhere in the file or notebook.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst
from libcst.metadata import PositionProvider

from horovod_compat.migrate.context import FAMILIES, HOROVOD, HVD, IMPORT_FOR_NAME, RUNNER, SharedState, code_of
from horovod_compat.migrate.helpers import HELPERS

_ORDER = list(IMPORT_FOR_NAME)
_RUNNER_MODULES = ("sparkdl", "sparkdl.horovod")


def dotted_name(node: Union[cst.Attribute, cst.Name, None]) -> str:
    """``a.b.c`` as written ("" for None)."""
    return code_of(node).strip() if node is not None else ""


def alias_bound(alias: cst.ImportAlias) -> str:
    """The local name an import alias binds (``import a.b`` binds ``a``)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return dotted_name(alias.name).split(".")[0]


def _alias_family(stmt: Union[cst.Import, cst.ImportFrom], alias: cst.ImportAlias) -> Optional[str]:
    """HVD for ``import horovod.torch as X`` / ``from horovod import torch as X``; RUNNER for
    ``from sparkdl import HorovodRunner``; HOROVOD for ``import horovod`` and for ``import
    horovod.spark`` (it binds ``horovod`` too: ImportScan keeps its TODO where the file uses
    ``horovod.spark``); else None."""
    name = dotted_name(alias.name)
    if isinstance(stmt, cst.Import):
        if name == "horovod" or _submodule_import(name, alias):
            return HOROVOD
        return HVD if name == "horovod.torch" and alias.asname is not None else None
    module = dotted_name(stmt.module) if stmt.module is not None else ""
    if stmt.relative:
        return None
    if module == "horovod" and name == "torch" and alias.asname is not None:
        return HVD
    if module in _RUNNER_MODULES and name == "HorovodRunner":
        return RUNNER
    return None


def _submodule_import(name: str, alias: cst.ImportAlias) -> bool:
    """``import horovod.X`` (not horovod.torch, nor another framework's binding), which binds the
    name ``horovod``."""
    return (name.startswith("horovod.") and alias.asname is None and name != "horovod.torch"
            and not any(name == b or name.startswith(b + ".") for b in OTHER_FRAMEWORKS))


#: Horovod's bindings of other frameworks than PyTorch, by module: the rewriter migrates
#: horovod.torch programs only, and leaves an input that imports one of these as it is.
OTHER_FRAMEWORKS = {"horovod.tensorflow": "TensorFlow", "horovod.keras": "Keras",
                    "horovod.spark.keras": "Keras", "horovod.mxnet": "MXNet"}


def other_framework(stmt: Union[cst.Import, cst.ImportFrom]) -> Optional[Tuple[str, str]]:
    """(module, framework) when `stmt` imports Horovod's binding of another framework than
    PyTorch (``import horovod.tensorflow.keras as hvd``, ``from horovod import tensorflow``,
    ``from horovod.spark.keras import KerasEstimator``), else None."""
    if isinstance(stmt, cst.Import):
        modules = [dotted_name(alias.name) for alias in stmt.names]
    elif stmt.relative or stmt.module is None:
        return None
    else:
        module = dotted_name(stmt.module)
        names = [] if isinstance(stmt.names, cst.ImportStar) else [dotted_name(a.name) for a in stmt.names]
        modules = [module, *(f"{module}.{name}" for name in names)]
    for module in modules:
        for binding, framework in OTHER_FRAMEWORKS.items():
            if module == binding or module.startswith(binding + "."):
                return module, framework
    return None


class OtherFrameworkScan(cst.CSTVisitor):
    """The line and (module, framework) of every import of another framework's Horovod binding."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.found: List[Tuple[int, str, str]] = []

    def _scan(self, stmt: Union[cst.Import, cst.ImportFrom]) -> None:
        binding = other_framework(stmt)
        if binding is not None:
            self.found.append((self.get_metadata(PositionProvider, stmt).start.line, *binding))

    def visit_Import(self, node: cst.Import) -> None:
        self._scan(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._scan(node)


def unsupported_import(stmt: Union[cst.Import, cst.ImportFrom]) -> Optional[str]:
    """A TODO message for Horovod import forms the rewriter does not follow, else None."""
    if isinstance(stmt, cst.Import):
        for alias in stmt.names:
            name = dotted_name(alias.name)
            if name == "horovod.torch" and alias.asname is None:
                return "`import horovod.torch` without `as hvd`: uses are not rewritten; import it as hvd"
            if name.startswith("horovod.") and name != "horovod.torch":
                return (f"`import {name}`: not followed (the rewriter follows `import horovod.torch as "
                        "hvd`, and names or submodules of horovod.torch bound once)")
        return None
    if stmt.relative or stmt.module is None:
        return None
    module = dotted_name(stmt.module)
    if module == "horovod.torch.optimizer" and not isinstance(stmt.names, cst.ImportStar) \
            and any(dotted_name(a.name) == "_DistributedOptimizer" for a in stmt.names):
        return ("Horovod's private _DistributedOptimizer has no native class: as a type annotation, "
                "write torch.optim.Optimizer (the migrated optimizer is the plain one); as a base class, "
                "build the optimizer with hvd.DistributedOptimizer (rewritten to plain torch.distributed) and "
                "put your override on a subclass of the base optimizer, or keep this file on horovod-compat")
    if module.startswith("horovod.") or (module == "horovod" and not isinstance(stmt.names, cst.ImportStar)
                                         and any(dotted_name(a.name) != "torch" or a.asname is None for a in stmt.names)):
        return (f"`from {module} import ...`: not followed (the rewriter follows `import "
                "horovod.torch as hvd`, and names or submodules of horovod.torch bound once)")
    return None


class ImportScan(cst.CSTVisitor):
    """Record Horovod/HorovodRunner aliases and module-level import names into SharedState, and
    the families whose alias is used outside every function that imports it (``self._hvd = hvd``
    in ``setup()``, ``hvd = self._hvd`` in another method): ``stray``."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared
        self.unsupported: List[Tuple[cst.CSTNode, str]] = []
        self.depth = 0
        self.functions: List[cst.FunctionDef] = []
        #: alias -> the functions that import it (None: imported outside any function)
        self.sites: Dict[str, Set[Optional[cst.FunctionDef]]] = {}
        #: alias -> the enclosing functions of each `alias.X` use
        self.uses: Dict[str, List[Tuple[cst.FunctionDef, ...]]] = {}
        #: ``import horovod.X`` statements (their modules, the TODO if the file uses them)
        self.submodules: List[Tuple[cst.Import, List[str], str]] = []
        #: the attribute expressions the file uses that start with ``horovod.``
        self.horovod_chains: Set[str] = set()
        #: the ``horovod.spark`` of each ``horovod.spark.run``: not a use of its own
        self.spark_run: Set[cst.Attribute] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1
        self.functions.pop()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Name):
            self.uses.setdefault(node.value.value, []).append(tuple(self.functions))
        root = node.value
        while isinstance(root, cst.Attribute):
            root = root.value
        if isinstance(root, cst.Name) and root.value == "horovod" and node not in self.spark_run:
            chain = dotted_name(node)
            if chain == "horovod.spark.run":  # rewritten, or a TODO of its own (runner.py)
                self.spark_run.add(node.value)
            else:
                self.horovod_chains.add(chain)

    def visit_Import(self, node: cst.Import) -> bool:
        self._scan(node)
        return False  # (its dotted names are no uses)

    def leave_Module(self, original_node: cst.Module) -> None:
        for stmt, modules, problem in self.submodules:
            if any(c == m or c.startswith(m + ".") for c in self.horovod_chains for m in modules):
                self.unsupported.append((stmt, problem))

    def stray(self) -> Set[str]:
        """The families with an ``alias.X`` use in no function that imports the alias, where no
        import of it stands outside a function: their native imports must go at module level."""
        found = set()
        for family in FAMILIES:
            for alias in self.shared.aliases(family):
                sites = self.sites.get(alias, set())
                if not sites or None in sites:
                    continue
                if any(not sites & set(enclosing) for enclosing in self.uses.get(alias, ())):
                    found.add(family)
        return found

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.depth -= 1

    def _scan(self, stmt: Union[cst.Import, cst.ImportFrom]) -> None:
        problem = unsupported_import(stmt)
        if problem and isinstance(stmt, cst.Import) and all(
                _submodule_import(dotted_name(a.name), a) for a in stmt.names):
            # ``import horovod.spark`` that nothing uses goes with the other Horovod imports
            self.submodules.append((stmt, [dotted_name(a.name) for a in stmt.names], problem))
        elif problem:
            self.unsupported.append((stmt, problem))
        if isinstance(stmt.names, cst.ImportStar):
            return
        for alias in stmt.names:
            family = _alias_family(stmt, alias)
            bound = alias_bound(alias)
            if family is not None:
                self.shared.aliases(family).add(bound)
                self.sites.setdefault(bound, set()).add(self.functions[-1] if self.functions else None)
            elif self.depth == 0:
                self.shared.global_imports.add(bound)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._scan(node)


_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")


def _is_import_fallback(handler: cst.ExceptHandler) -> bool:
    """``except ImportError:`` (or ModuleNotFoundError, or a tuple of them): what a program does
    when Horovod is missing (``hvd = None``) is not a use of Horovod."""
    kind = handler.type
    names = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    return bool(names) and all(isinstance(n, cst.Name) and n.value in _IMPORT_ERRORS for n in names)


def _checks_import(small: cst.BaseSmallStatement, names: Set[str]) -> bool:
    """``assert hvd is not None[, message]``: the check, in a program whose Horovod import is
    optional, that the import worked. It goes with the import (torch.distributed is part of
    torch), so it is not a use of Horovod."""
    if not (isinstance(small, cst.Assert) and isinstance(small.test, cst.Comparison)):
        return False
    test = small.test
    return (isinstance(test.left, cst.Name) and test.left.value in names and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.IsNot)
            and isinstance(test.comparisons[0].comparator, cst.Name)
            and test.comparisons[0].comparator.value == "None")


def _without_removed(small: cst.BaseSmallStatement, removed: Set[str]) -> Optional[cst.BaseSmallStatement]:
    """`global hvd` (or `global hvd, other`) whose import went: without those names, or None."""
    if not isinstance(small, cst.Global) or not any(n.name.value in removed for n in small.names):
        return small
    kept = [n for n in small.names if n.name.value not in removed]
    if not kept:
        return None
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return small.with_changes(names=kept)


class _Remaining(cst.CSTVisitor):
    """Count uses of given names outside import statements (and import-error fallbacks, and checks
    that the import worked)."""

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self.count = 0

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> bool:
        return not _is_import_fallback(node)

    def visit_Assert(self, node: cst.Assert) -> bool:
        return not _checks_import(node, self.names)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # (`self.hvd`, an attribute of that name, is no use of `hvd`)
        return False

    def visit_Global(self, node: cst.Global) -> bool:
        return False  # `global hvd` beside a function's import declares, it does not use

    def visit_Param(self, node: cst.Param) -> bool:
        # a parameter named `hvd` (the module handed in by a caller) binds a local name: only
        # its annotation and default are uses
        for part in (node.annotation, node.default):
            if part is not None:
                part.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.count += 1


def remaining_uses(module: cst.Module, names: Set[str]) -> int:
    """How many times any of `names` is still used (imports excluded)."""
    if not names:
        return 0
    visitor = _Remaining(names)
    module.visit(visitor)
    return visitor.count


@dataclasses.dataclass
class ImportPlan:
    """Inputs of the import fix-up for one unit."""

    unit_needs: Dict[str, Set[str]]
    all_needs: Dict[str, Set[str]]
    remove: Dict[str, bool]
    has_module_site: Dict[str, bool]
    #: Families used outside the functions that import them (ImportScan.stray): their native
    #: imports go at module level too.
    stray: Set[str]
    global_imports: Set[str]
    helpers: Sequence[str]


def _imports_in(body: Sequence[cst.CSTNode]) -> Set[str]:
    names: Set[str] = set()
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    names.update(alias_bound(a) for a in small.names)
    return names


class ImportFixer(cst.CSTTransformer):
    """Replace Horovod imports by native ones (see module docstring); insert helper functions."""

    def __init__(self, shared: SharedState, plan: ImportPlan) -> None:
        self.shared = shared
        self.plan = plan
        self.module_imports: Set[str] = set()
        self.sites_seen: Set[str] = set()
        self.block_stack: List[Set[str]] = []
        self.stray_top: Set[str] = set()
        #: the names of the Horovod modules whose imports go
        self.removed: Set[str] = set().union(*(shared.aliases(f) for f in FAMILIES if plan.remove[f]))

    # Track names imported earlier in the current block (function bodies).
    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.block_stack.append(set())

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        self.block_stack.pop()
        if not updated_node.body:
            return updated_node.with_changes(body=[cst.parse_statement("pass\n")])
        return updated_node

    def visit_Module(self, node: cst.Module) -> None:
        self.module_imports = _imports_in(node.body) | self.plan.global_imports
        # what stray uses need goes at the top (leave_Module), so not again at the function's import
        self.stray_top = set().union(*(self.plan.unit_needs[f] for f in self.plan.stray)) - self.module_imports
        self.module_imports |= self.stray_top

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.SimpleStatementLine, cst.FlattenSentinel, cst.RemovalSentinel]:
        body = [_without_removed(small, self.removed) for small in updated_node.body
                if not _checks_import(small, self.removed)]
        body = [small for small in body if small is not None]
        if body != list(updated_node.body):
            if not body:
                return cst.RemoveFromParent()
            updated_node = updated_node.with_changes(body=body)
        at_module = not self.block_stack
        families: List[str] = []
        new_body: List[cst.BaseSmallStatement] = []
        for small in updated_node.body:
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                kept = []
                for alias in small.names:
                    family = _alias_family(small, alias)
                    if family is not None:
                        families.append(family)
                    if family is None or not self.plan.remove[family]:
                        kept.append(alias)
                if not kept:
                    continue
                if len(kept) != len(small.names):
                    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                    small = small.with_changes(names=kept)
                if not at_module:
                    self.block_stack[-1].update(alias_bound(a) for a in kept)
            new_body.append(small)
        if not families:
            return updated_node
        visible = self.module_imports | (self.block_stack[-1] if self.block_stack else set())
        wanted: Set[str] = set()
        for family in families:
            self.sites_seen.add(family)
            wanted |= self.plan.all_needs[family] if at_module else self.plan.unit_needs[family]
        added = [name for name in _ORDER if name in wanted and name not in visible]
        if self.block_stack:
            self.block_stack[-1].update(added)
        else:
            self.module_imports.update(added)
        statements: List[cst.BaseStatement] = []
        if new_body:
            statements.append(updated_node.with_changes(body=new_body))
        statements += [cst.parse_statement(IMPORT_FOR_NAME[name] + "\n") for name in added]
        if not statements:
            return cst.RemoveFromParent()
        if not new_body:
            statements[0] = statements[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(statements)

    def leave_Try(self, original_node: cst.Try, updated_node: cst.Try
                  ) -> Union[cst.Try, cst.FlattenSentinel, cst.RemovalSentinel]:
        """``try: import horovod.torch as hvd / except ImportError: hvd = None`` whose Horovod
        import went: the native imports left in its body stand on their own (they are part of
        torch), and the fallback, which only bound removed names, goes with the try."""
        removed = self.removed
        if not removed or updated_node.orelse is not None or updated_node.finalbody is not None:
            return updated_node
        if not all(_is_import_fallback(h) and _only_binds(h.body, removed) for h in updated_node.handlers):
            return updated_node
        had = _imports_in(original_node.body.body)
        body = [s for s in updated_node.body.body if not _is_pass(s)]
        if not (had & removed) or not all(_is_import_line(s) for s in body):
            return updated_node
        if not body:
            return cst.RemoveFromParent()
        body[0] = body[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        # Needs with no import site in this unit nor a module-level site elsewhere: add at top.
        missing: Set[str] = set()
        for family, names in self.plan.unit_needs.items():
            if names and family not in self.sites_seen and not self.plan.has_module_site[family]:
                missing |= names
        top = [n for n in _ORDER if (n in missing and n not in self.module_imports) or n in self.stray_top]
        index = _after_header(body)
        insert: List[cst.BaseStatement] = [cst.parse_statement(IMPORT_FOR_NAME[n] + "\n") for n in top]
        index_after_imports = _after_leading_imports(body, index)
        helpers = [h for h in self.plan.helpers]
        helper_nodes: List[cst.BaseStatement] = []
        for name in helpers:
            parsed = cst.parse_module(HELPERS[name].lstrip("\n")).body
            first = parsed[0].with_changes(
                leading_lines=[cst.EmptyLine(), cst.EmptyLine()] if body else []
            )
            helper_nodes += [first, *parsed[1:]]
        if helper_nodes and index_after_imports < len(body):
            following = body[index_after_imports]
            if not getattr(following, "leading_lines", None):
                body[index_after_imports] = following.with_changes(
                    leading_lines=[cst.EmptyLine(), cst.EmptyLine()]
                )
        body[index_after_imports:index_after_imports] = helper_nodes
        body[index:index] = insert
        return updated_node.with_changes(body=body)


def _is_pass(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, cst.Pass) for s in stmt.body)


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _only_binds(block: cst.BaseSuite, names: Set[str]) -> bool:
    """The block only assigns to `names` (``hvd = None``) or passes."""
    for stmt in getattr(block, "body", ()):
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        for small in stmt.body:
            if isinstance(small, cst.Pass):
                continue
            if not (isinstance(small, cst.Assign) and all(
                    isinstance(t.target, cst.Name) and t.target.value in names for t in small.targets)):
                return False
    return True


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _is_future(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.ImportFrom)
        and dotted_name(stmt.body[0].module) == "__future__"
    )


def _after_header(body: Sequence[cst.CSTNode]) -> int:
    """Index after a module docstring and ``from __future__`` imports."""
    i = 0
    if i < len(body) and _is_docstring(body[i]):
        i += 1
    while i < len(body) and _is_future(body[i]):
        i += 1
    return i


def _after_leading_imports(body: Sequence[cst.CSTNode], start: int) -> int:
    """Index after the run of import statements that starts at `start`."""
    i = start
    while i < len(body) and isinstance(body[i], cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in body[i].body
    ):
        i += 1
    return i
