"""How rank processes are started: one small `Launcher` interface, one module per way."""
from .base import Launcher
from .mpirun import MpirunLauncher
from .python import PythonLauncher

__all__ = ["Launcher", "MpirunLauncher", "PythonLauncher"]
