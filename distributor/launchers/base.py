"""The launcher interface: turn rank specs into running processes under a supervisor."""
from __future__ import annotations

import abc
from typing import Callable, Dict, Sequence

from ..spec import RankSpec
from ..supervisor import Supervisor

#: Builds the full environment of one rank.
EnvFactory = Callable[[RankSpec], Dict[str, str]]


class Launcher(abc.ABC):
    """Starts the ranks of one host. Implementations differ only in the processes they create."""

    #: True if one start, in the first Spark task, runs the ranks of every task (mpirun).
    spans_tasks = False

    def on_executor(self, python: str) -> None:
        """Adapt to the Spark executor this launcher was shipped to (its Python, its tools)."""
        if hasattr(self, "python"):
            self.python = python

    def in_reused_worker(self) -> None:
        """Called in a Spark task whose Python worker Spark keeps for later tasks: the launcher
        may keep what speeds up the next job's start there (see `PythonLauncher`)."""

    @abc.abstractmethod
    def start(self, ranks: Sequence[RankSpec], env_for: EnvFactory, supervisor: Supervisor) -> None:
        """Start every rank of `ranks` under `supervisor`; return without waiting for them."""
