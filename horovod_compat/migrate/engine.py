"""Rewrite Horovod source to native torch.distributed/DDP: the pipeline for one input.

An input is one or more *units* of Python source sharing a namespace: a ``.py`` file is one
unit; a notebook is one unit per code cell (cells share globals, so imports and the decision to
drop ``import horovod.torch as hvd`` are made over all cells together).

Pipeline: parse every unit -> scan imports (how hvd/HorovodRunner are named) -> per unit, plan
the DistributedOptimizer rewrite with scope analysis, then apply all rules -> fix imports over
all units (remove the Horovod import only if no ``hvd.`` use is left anywhere).
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider

from horovod_compat.migrate import renaming, syntax
from horovod_compat.migrate.context import FAMILIES, HVD, RewriteContext, SharedState
from horovod_compat.migrate.report import Finding, Kind
from horovod_compat.migrate.rules import flags, import_forms, lightning
from horovod_compat.migrate.rules.imports import (
    ImportFixer, ImportPlan, ImportScan, OtherFrameworkScan, remaining_uses,
)
from horovod_compat.migrate.rules.optimizer import plan_optimizers
from horovod_compat.migrate.rules.runner import RunnerVarScan
from horovod_compat.migrate.transform import HorovodTransformer


class MigrationError(Exception):
    """Input the rewriter cannot read (syntax error, unreadable notebook); names the location."""


@dataclasses.dataclass
class Unit:
    """One piece of source to rewrite: `location` names it in messages (``file.py``,
    ``nb.ipynb[cell 2]``); `line_offset` is added to line numbers in findings."""

    source: str
    location: str
    line_offset: int = 0


@dataclasses.dataclass
class UnitResult:
    """The rewritten source of a unit and what was found in it."""

    source: str
    findings: List[Finding]
    original: str

    @property
    def changed(self) -> bool:
        """True when the output differs from the input."""
        return self.source != self.original


def _parse(unit: Unit) -> cst.Module:
    # Python's own parser gives the location users expect; libcst's can point a line off.
    try:
        compile(unit.source, unit.location, "exec",
                ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as err:
        line = (err.lineno or 1) + unit.line_offset
        raise MigrationError(f"{unit.location}:{line}:{err.offset or 1}: syntax error: {err.msg}") from None
    try:
        return cst.parse_module(unit.source)
    except cst.ParserSyntaxError as err:
        line = err.raw_line + unit.line_offset
        raise MigrationError(
            f"{unit.location}:{line}:{err.raw_column + 1}: syntax error: {err.message}"
        ) from None


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: Set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def _names(module: cst.Module) -> Set[str]:
    visitor = _Names()
    module.visit(visitor)
    return visitor.names


def _module_level_families(module: cst.Module, shared: SharedState) -> Set[str]:
    """Families (see context.FAMILIES) imported at module level in this unit."""
    families: Set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        bound = (alias.asname.name.value if alias.asname is not None
                                 and isinstance(alias.asname.name, cst.Name)
                                 else cst.Module([]).code_for_node(alias.name).split(".")[0])
                        families.update(f for f in FAMILIES if bound in shared.aliases(f))
    return families


#: What each name the rewrite may introduce may be bound to, if the input binds it already (the
#: first is what the rewrite imports). Either TorchDistributor will do: they have one API.
_CANONICAL: Dict[str, Tuple[str, ...]] = {
    "atexit": ("atexit",),
    "gc": ("gc",),
    "os": ("os",),
    "torch": ("torch",),
    "dist": ("torch.distributed",),
    "DDP": ("torch.nn.parallel.DistributedDataParallel",),
    "default_hooks": ("torch.distributed.algorithms.ddp_comm_hooks.default_hooks",),
    "functools": ("functools",),
    "contextlib": ("contextlib",),
    "Join": ("torch.distributed.algorithms.join.Join", "torch.distributed.algorithms.Join"),
    "replicate": ("torch.distributed._composable.replicate",),
    "elastic_launch": ("torch.distributed.launcher.api.elastic_launch",),
    "TorchDistributor": ("pyspark.ml.torch.distributor.TorchDistributor",
                         "distributor.TorchDistributor",
                         "distributor.torch_distributor.TorchDistributor"),
}


def _foreign_bindings(scopes: Mapping[cst.CSTNode, object], positions) -> Dict[str, int]:
    """Names the rewrite may introduce (``dist``, ``DDP``, ...) that the input binds to something
    else, with the line of the first such binding: rewriting would shadow or be shadowed."""
    found: Dict[str, int] = {}
    for scope in {s for s in scopes.values() if s is not None}:
        for assignment in scope.assignments:
            name = assignment.name
            if name not in _CANONICAL or name in found or not hasattr(assignment, "node"):
                continue
            node = assignment.node
            if isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
                targets = set()
                for alias in node.names:
                    dotted = cst.Module([]).code_for_node(alias.name)
                    # `import a.b` binds `a`; `from m import x` binds `x`; `... as y` binds `y`.
                    bound = (alias.asname.name.value if alias.asname is not None
                             and isinstance(alias.asname.name, cst.Name)
                             else dotted if isinstance(node, cst.ImportFrom) else dotted.split(".")[0])
                    if isinstance(node, cst.ImportFrom) and node.module is not None:
                        dotted = cst.Module([]).code_for_node(node.module) + "." + dotted
                    if bound == name:
                        targets.add(dotted if alias.asname is not None or isinstance(node, cst.ImportFrom)
                                    else dotted.split(".")[0])
                if targets <= set(_CANONICAL[name]):
                    continue
            found[name] = positions[node].start.line if node in positions else 1
    return found


def migrate_units(units: Sequence[Unit], emulate: bool = False) -> List[UnitResult]:
    """Rewrite every unit; raises MigrationError on unparsable input (nothing is rewritten then).

    `emulate`: a ``DistributedOptimizer`` whose model cannot be made data-parallel (DDP or in
    place) becomes ``_native_distributed_optimizer``, Horovod's averaging in the optimizer written
    with torch.distributed; without it (the default), it stays with a TODO that says why.

    When Horovod uses remain after the rewrite, it runs again keeping ``hvd.init()`` and
    ``hvd.shutdown()`` beside their native replacements and Horovod's constants where they are
    values (rules/constants.py): the partly migrated program then runs where the original did
    (under horovodrun, or under torchrun with horovod-compat installed), instead of stopping at
    its first remaining ``hvd.`` call.

    A name the rewrite needs (``dist``, ``DDP``, ...) that the input binds to something else (say
    ``import pyro.distributions as dist``) is not shadowed: the rewrite runs again with the input's
    name set aside, and the native code takes a free name instead (``torch_dist``)."""
    if not any(_may_use_horovod(unit) for unit in units):
        return [UnitResult(unit.source, [], unit.source) for unit in units]
    left_alone = _other_frameworks(units)
    if left_alone is not None:
        return left_alone
    renames: Dict[str, str] = {}
    results, horovod_left, clashes, held = _migrate(units, False, renames, emulate, True)
    if clashes:
        taken = set().union(*(_names(_parse(unit)) for unit in units))
        renames = {name: renaming.free_name(name, taken) for name in clashes}
        results, horovod_left, clashes, held = _migrate(units, False, renames, emulate, True)
    if horovod_left and held:
        # A use of an attribute holding the module, brought to `hvd.X`, may sit where no import
        # binds `hvd`: that form stands only when no Horovod use is left (import_forms).
        results, horovod_left, _, _ = _migrate(units, False, renames, emulate, False)
    if horovod_left and any(r.changed for r in results):
        results, _, _, _ = _migrate(units, True, renames, emulate, False)
    return results


def _may_use_horovod(unit: Unit) -> bool:
    """False only when `unit` surely has nothing to rewrite: it parses, imports no module of a
    package whose name starts with ``horovod`` (this project's included) nor ``sparkdl``, nor
    Lightning (whose removed hooks get a TODO with or without Horovod), and imports nothing by
    name at run time (``__import__``, ``import_module``). Every other rule starts from such an
    import, so the pipeline (a dozen walks over the tree) would return the input unchanged, with
    no finding: a file already migrated, or never on Horovod."""
    if "__import__" in unit.source or "import_module" in unit.source \
            or lightning.uses_lightning(unit.source) or flags.REACHED_BY_OTHER_NAMES.search(unit.source):
        return True
    try:
        tree = ast.parse(unit.source)
    except (SyntaxError, ValueError):
        return True  # (the pipeline says where)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                continue
            modules = [node.module or ""]
        else:
            continue
        if any(m.split(".")[0].startswith("horovod") or m.split(".")[0] == "sparkdl" for m in modules):
            return True
    return False


def _other_frameworks(units: Sequence[Unit]) -> Optional[List[UnitResult]]:
    """Every unit as it was, with a TODO at each import of another framework's Horovod binding
    (``import horovod.tensorflow.keras as hvd``), when the input has one; else None.

    The rewriter migrates horovod.torch programs; in TensorFlow or Keras code its only rewrites
    would be the launchers (HorovodRunner -> TorchDistributor, horovod.run -> elastic_launch), which
    would bring torch into a program that does not use it and move it no closer to native."""
    results = [UnitResult(unit.source, [], unit.source) for unit in units]
    found = False
    for unit, result in zip(units, results):
        if not any(word in unit.source for word in ("tensorflow", "keras", "mxnet")):
            continue  # (no such import: spare the parse)
        scan = OtherFrameworkScan()
        MetadataWrapper(_parse(unit), unsafe_skip_copy=True).visit(scan)
        ctx = RewriteContext(unit.location, SharedState(), line_offset=unit.line_offset)
        for line, module, framework in scan.found:
            guide = (" (migration_guide/tensorflow.md: to tf.distribute.MultiWorkerMirroredStrategy)"
                     if framework != "MXNet" else "")
            ctx.todo(line, "import", f"`{module}` is {framework} code: the rewriter migrates horovod.torch "
                     f"programs only, so nothing in this input was rewritten. Migrate it by hand{guide}")
        result.findings.extend(ctx.findings)
        found = found or bool(scan.found)
    return results if found else None


def _migrate(units: Sequence[Unit], keep_lifecycle: bool, renames: Mapping[str, str], emulate: bool,
             held: bool) -> Tuple[List[UnitResult], bool, List[str], bool]:
    """One pass over the units: (results, whether `horovod.torch` uses remain, the names the
    rewrite needs that the input binds to something else, whether an attribute holding the module
    was followed). `renames` {name: free name}: the input's own `name` is set aside during the
    rewrite and the native code's takes `free name`; `held`: follow such attributes."""
    aside, back = renaming.set_aside(renames)
    modules = [_parse(unit) for unit in units]
    if renames:
        modules = [m.visit(renaming.Rename(aside)) for m in modules]
    every = [_names(m) for m in modules]
    # One metadata wrapper per module: the normalization's scopes and parents serve the rewrite
    # when it changes nothing (each resolution is a walk over the whole tree).
    normalized = [import_forms.normalize(MetadataWrapper(m, unsafe_skip_copy=True), every[i],
                                         set().union(*every[:i], *every[i + 1:]), held)
                  for i, m in enumerate(modules)]
    wrappers = [w for w, _ in normalized]
    followed = any(f for _, f in normalized)
    names = [every[i] if w.module is m else _names(w.module)
             for i, (w, m) in enumerate(zip(wrappers, modules))]
    modules = [w.module for w in wrappers]
    shared = SharedState(keep_horovod_lifecycle=keep_lifecycle, all_native=not keep_lifecycle,
                         emulate=emulate)
    unsupported: List[Dict[cst.CSTNode, str]] = []
    stray: List[Set[str]] = []
    for module in modules:
        scan = ImportScan(shared)
        module.visit(scan)
        unsupported.append(dict(scan.unsupported))
        stray.append(scan.stray())
    for module in modules:
        module.visit(RunnerVarScan(shared.runner_names, shared.runner_vars))
    shared.lightning = any(lightning.uses_lightning(unit.source) for unit in units)
    shared.names = set().union(*names)
    shared.calls_join = any(re.search(rf"\b{re.escape(alias)}\.join\(", unit.source)
                            for alias in shared.hvd_aliases for unit in units)

    rewritten: List[cst.Module] = []
    contexts: List[RewriteContext] = []
    foreign: List[Dict[str, int]] = []
    for i, (unit, wrapper) in enumerate(zip(units, wrappers)):
        ctx = RewriteContext(unit.location, shared, line_offset=unit.line_offset)
        contexts.append(ctx)
        resolved = wrapper.resolve_many([PositionProvider, ScopeProvider, ParentNodeProvider])
        positions = resolved[PositionProvider]
        scopes = resolved[ScopeProvider]
        parents = resolved[ParentNodeProvider]
        elsewhere = set().union(*(n for j, n in enumerate(names) if j != i)) if len(names) > 1 else set()
        foreign.append(_foreign_bindings(scopes, positions))
        plan = plan_optimizers(wrapper.module, positions, scopes, parents, ctx, set(names[i]), elsewhere)
        rewritten.append(wrapper.visit(HorovodTransformer(ctx, plan, unsupported[i])))

    remove = {f: sum(remaining_uses(m, shared.aliases(f)) for m in rewritten) == 0 for f in FAMILIES}
    all_needs: Dict[str, Set[str]] = {f: set() for f in FAMILIES}
    for ctx in contexts:
        for family, needed in ctx.needs.items():
            all_needs[family] |= needed
    needed = set().union(*all_needs.values())
    clashes = [(i, name, line) for i, names in enumerate(foreign) for name, line in names.items() if name in needed]
    if clashes:
        # Leave the whole input unchanged rather than shadow the user's name (or ours).
        results = [UnitResult(unit.source, [], unit.source) for unit in units]
        for i, name, line in clashes:
            ctx = RewriteContext(units[i].location, shared, line_offset=units[i].line_offset)
            ctx.todo(line, name, f"`{name}` is already bound here to something other than "
                     f"{_CANONICAL[name][0]}; the rewrite needs that name. Rename yours and run again "
                     "(nothing in this file was rewritten)")
            results[i].findings.extend(ctx.findings)
        return results, False, sorted({name for _, name, _ in clashes}), followed
    module_sites: Set[str] = set()
    for module in modules:
        module_sites |= _module_level_families(module, shared)

    results: List[UnitResult] = []
    for unit, module, ctx, unit_stray in zip(units, rewritten, contexts, stray):
        plan = ImportPlan(
            unit_needs=ctx.needs,
            all_needs=all_needs,
            remove=remove,
            has_module_site={f: f in module_sites for f in FAMILIES},
            stray=unit_stray,
            global_imports=set(shared.global_imports),
            helpers=ctx.helpers,
        )
        fixed = module.visit(ImportFixer(shared, plan))
        if syntax.has_fstring(unit.source):  # the rewrite's own code writes no string in braces
            fixed = fixed.visit(syntax.FStringQuotes())
        if renames:
            fixed = fixed.visit(renaming.Rename(back))
        findings = list(ctx.findings)
        results.append(UnitResult(fixed.code, findings, unit.source))
    return _checked(units, results), not remove[HVD], [], followed


def _checked(units: Sequence[Unit], results: List[UnitResult]) -> List[UnitResult]:
    """The results, or every unit as it was (with a TODO) if any rewritten unit would not parse
    on every Python we support: a rewrite is never worse than its input."""
    for unit, result in zip(units, results):
        problem = syntax.parse_problem(unit.source, result.source, unit.location) if result.changed else None
        if problem is None:
            continue
        ctx = RewriteContext(unit.location, SharedState(), line_offset=unit.line_offset)
        ctx.todo(1, "rewrite", f"the rewritten code would not parse ({problem}); nothing was "
                 "rewritten. Please report this with the input")
        kept = [UnitResult(u.source, [f for f in r.findings if f.kind is not Kind.REWRITE], u.source)
                for u, r in zip(units, results)]
        kept[units.index(unit)].findings.extend(ctx.findings)
        return kept
    return results


def migrate_source(source: str, location: str = "<string>", emulate: bool = False) -> UnitResult:
    """Rewrite one Python source text (a whole file); `emulate` as for migrate_units."""
    return migrate_units([Unit(source, location)], emulate)[0]
