"""Packages whose public names are imported on first use (PEP 562).

Rank processes and the small helpers started for each job (`rank_entry`, `forkserver`,
`launchers.remote_shell`) live inside these packages; importing a package must not cost them
the driver's whole engine.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Tuple


def lazy_exports(package: str, exports: Dict[str, str]) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The module `__getattr__` and `__dir__` of `package`, whose name N is imported from the
    module `exports[N]` (relative to the package) when first asked for."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
