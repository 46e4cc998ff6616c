"""How rank processes are started: one small `Launcher` interface, one module per way.

The classes are imported on first use, so that `python -m distributor.launchers.remote_shell`
(started by mpirun for every host of a job) loads only what it needs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {"Launcher": ".base", "LauncherCapabilities": ".base", "MpirunLauncher": ".mpirun", "PythonLauncher": ".python"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # what static tools see
    from .base import Launcher, LauncherCapabilities
    from .mpirun import MpirunLauncher
    from .python import PythonLauncher
