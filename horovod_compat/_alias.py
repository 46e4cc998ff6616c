"""Import aliases: make ``import horovod.torch`` (and later ``import sparkdl``) resolve to this project.

Mechanism: a meta-path finder, inserted at the front of ``sys.meta_path`` by the thin alias
packages shipped with this distribution (top-level ``horovod/``; ``sparkdl/`` can be added the same
way), maps ``<alias>.<rest>`` to ``<target>.<rest>``.  The alias module IS the target module object
(``sys.modules['horovod.torch'] is sys.modules['horovod_compat.torch']``), so there is exactly one
copy of every module and of its state (``hvd.init()`` through either name is the same thing).

Why a real package plus a finder (and not a ``.pth`` hook): a real top-level package works the same
for editable and regular installs, in any interpreter (plain python, torchrun, mpirun, Spark
workers) without relying on site-packages ``.pth`` processing; the finder then saves us from
mirroring every submodule by hand.

To alias another name, add a two-line package::

    # sparkdl/__init__.py
    from horovod_compat._alias import install
    install("sparkdl", "horovod_compat.sparkdl")

and list the package in setup.cfg's ``packages.find``.  Set ``HOROVOD_COMPAT_DISABLE_ALIAS=1`` to
turn every alias off (then ``horovod.*`` submodules come from whatever is on disk).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

__all__ = ["install", "AliasFinder", "aliases"]

#: alias prefix -> target prefix, e.g. {"horovod": "horovod_compat"}
aliases: Dict[str, str] = {}
#: exact module names that map elsewhere than the prefix rule, e.g. horovod.common -> ...
overrides: Dict[str, str] = {}
#: fullname -> message (or None): explains why an aliased module does not exist here; the import
#: then raises ModuleNotFoundError with that message instead of a bare "No module named ...".
explainers: List[Callable[[str], Optional[str]]] = []


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec):  # type: ignore[override]
        module = importlib.import_module(self.target)
        spec.loader_state = module.__spec__  # restored in exec_module
        return module

    def exec_module(self, module) -> None:  # type: ignore[override]
        # importlib stamped the alias spec on the shared module object; give it its own back so
        # pickling, reload and introspection keep seeing the real module.
        original = module.__spec__.loader_state if module.__spec__ is not None else None
        if original is not None:
            module.__spec__ = original


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``<alias>.<rest>`` as ``<target>.<rest>`` for every registered alias."""

    def _target(self, fullname: str) -> Optional[str]:
        if fullname in overrides:
            return overrides[fullname]
        for alias, target in aliases.items():
            if fullname.startswith(alias + "."):
                return target + fullname[len(alias):]
        return None

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target=None):  # type: ignore[override]
        real = self._target(fullname)
        if real is None:
            return None
        for explain in explainers:
            message = explain(fullname)
            if message:
                raise ModuleNotFoundError(message, name=fullname)
        try:
            found = importlib.util.find_spec(real)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(real),
            is_package=found.submodule_search_locations is not None)


_finder = AliasFinder()


def install(alias: str, target: str, extra: Optional[Dict[str, str]] = None,
            explain: Optional[Callable[[str], Optional[str]]] = None) -> None:
    """Resolve submodules of ``alias`` (a real, thin package) to those of ``target``.

    ``extra`` maps exact module names to other targets (``{"horovod.common": "horovod_compat.common"}``).
    ``explain(fullname)`` may return the message of the ModuleNotFoundError for a submodule this
    project deliberately does not provide.
    Idempotent; a no-op when ``HOROVOD_COMPAT_DISABLE_ALIAS=1``.
    """
    if os.environ.get("HOROVOD_COMPAT_DISABLE_ALIAS", "0") not in ("", "0"):
        return
    aliases[alias] = target
    overrides.update(extra or {})
    if explain is not None and explain not in explainers:
        explainers.append(explain)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
