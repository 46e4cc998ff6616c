"""Modules inside ``horovod_compat`` (and ``distributor``) import only downward: no import cycle,
whether the import sits at module level or inside a function (a function-level import is how a
cycle hides).  The graph is read from the sources with ``ast``; nothing is imported."""
from __future__ import annotations

import ast
import os
import sys
from typing import Dict, List, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules(package: str) -> Dict[str, str]:
    mods = {}
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                if name.endswith(".__init__"):
                    name = name[: -len(".__init__")]
                mods[name] = path
    return mods


def _package_of(name: str, path: str) -> List[str]:
    """The parts of the package that module ``name`` (at ``path``) imports relative to."""
    return name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]


def _from_base(node: ast.ImportFrom, here: List[str]) -> str:
    """The absolute name of the module a ``from ... import`` in package ``here`` imports from."""
    if node.level:
        return ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
    return node.module or ""


def _imports(name: str, path: str, mods: Dict[str, str]) -> Set[str]:
    """The package-internal modules ``name`` imports (submodules named in ``from X import y``
    included; the module's own ancestors excluded: importing a submodule runs them anyway)."""
    here = _package_of(name, path)
    out: Set[str] = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        targets: List[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, here)
            if node.module:
                targets.append(base)
            targets += [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t in mods and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


def _cycles(package: str) -> List[List[str]]:
    mods = _modules(package)
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", ["horovod_compat", "distributor"])
def test_no_import_cycles(package: str) -> None:
    cycles = _cycles(package)
    assert cycles == [], f"import cycles in {package}: {cycles}"


def test_the_checker_sees_a_cycle(tmp_path, monkeypatch) -> None:
    """The checker itself: two modules importing each other inside functions are reported."""
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from .a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert _cycles("cyc") == [["cyc.a", "cyc.b"]]


def _external_imports(path: str) -> Set[str]:
    """Top-level names of every module ``path`` imports (absolute imports only)."""
    out: Set[str] = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
    return out


# The line between the runtime and the framework bindings (docs/architecture.md): the runtime
# knows no binding and no framework API beyond torch.distributed's buffers; the bindings know the
# runtime and not each other.
_LAYERS = {
    "horovod_compat.common": ("horovod_compat.torch", "horovod_compat.tensorflow",
                              "horovod_compat.keras", "horovod_compat._keras", "tensorflow",
                              "keras", "tf_keras", "torch.nn", "torch.optim", "torch.autograd"),
    "horovod_compat.torch": ("horovod_compat.tensorflow", "horovod_compat.keras",
                             "horovod_compat._keras", "tensorflow", "keras", "tf_keras"),
    "horovod_compat.tensorflow": ("horovod_compat.torch",),
}


@pytest.mark.parametrize("package", sorted(_LAYERS))
def test_the_runtime_and_the_bindings_import_only_downward(package: str) -> None:
    forbidden = _LAYERS[package]
    bad = []
    for name, path in sorted(_modules(package.replace(".", os.sep)).items()):
        for mod in sorted(_external_imports(path)):
            if any(mod == f or mod.startswith(f + ".") for f in forbidden):
                bad.append(f"{name} imports {mod}")
    assert bad == [], "\n".join(bad)


def _defined(tree: ast.Module, mods: Dict[str, str], name: str) -> Set[str] | None:
    """The names module ``name`` (parsed: ``tree``) binds at its top level -- functions, classes,
    assignments and imports, inside top-level ``if``/``try``/``with`` blocks too -- plus its
    submodules if it is a package; None when it can bind names this reading cannot see (a module
    ``__getattr__``, a star import, writes to ``globals()``)."""
    out: Set[str] = {m.rsplit(".", 1)[1] for m in mods if m.rsplit(".", 1)[0] == name and "." in m}
    out |= {"__file__", "__name__", "__doc__", "__spec__", "__path__", "__dict__", "__loader__"}
    pending: List[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                out.add(a.asname or a.name.split(".")[0])
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    out.add(sub.id)
            for field in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(s for s in getattr(node, field, []) if isinstance(s, ast.stmt))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            out.update(node.names)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "globals":
            return None
    return out


def _module_aliases(name: str, path: str, tree: ast.AST, mods: Dict[str, str]) -> Dict[str, str]:
    """Local name -> package-internal module, for each ``from P import m`` and ``import P.m as x``
    in the module at ``path`` (module level or inside functions)."""
    here = _package_of(name, path)
    out: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _from_base(node, here)
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    out[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in mods:
                    out[a.asname] = a.name
    return out


def _missing_attributes(packages: List[str]) -> List[str]:
    """``m.attr`` reads, in the packages' sources, of a package-internal module ``m`` that binds no
    ``attr`` (and that no module of the packages assigns as ``m.attr = ...``)."""
    mods: Dict[str, str] = {}
    for package in packages:
        mods.update(_modules(package))
    trees = {m: ast.parse(open(p).read(), p) for m, p in mods.items()}
    aliases = {m: _module_aliases(m, mods[m], trees[m], mods) for m in mods}
    defined = {m: _defined(tree, mods, m) for m, tree in trees.items()}
    for m, tree in trees.items():  # attributes set from outside: `_shm.x = ...`
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id in aliases[m]
                    and defined[aliases[m][node.value.id]] is not None):
                defined[aliases[m][node.value.id]].add(node.attr)
    bad = []
    for m, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name) and node.value.id in aliases[m]):
                target = aliases[m][node.value.id]
                names = defined[target]
                if names is not None and node.attr not in names:
                    bad.append(f"{mods[m]}:{node.lineno}: {node.value.id}.{node.attr} "
                               f"({target} binds no {node.attr!r})")
    return bad


def test_every_attribute_read_off_an_internal_module_exists() -> None:
    """A name removed from a module and still read as ``module.name`` elsewhere fails only when
    that line runs -- often an error path (as ``negotiation`` calling ``_shm._alive`` after it
    moved to ``procfs.alive``).  Checked here for every such read, whatever runs it."""
    bad = _missing_attributes(["horovod_compat", "distributor", "horovod", "sparkdl"])
    assert bad == [], "\n".join(bad)


def test_the_attribute_checker_sees_a_missing_name(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "att"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("X = 1\nif X:\n    Y = 2\ndef f():\n    pass\n")
    (pkg / "b.py").write_text("from . import a\n\ndef g():\n    return a.f(), a.X, a.Y, a.gone\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    bad = _missing_attributes(["att"])
    assert len(bad) == 1 and bad[0].endswith("b.py:4: a.gone (att.a binds no 'gone')"), bad
