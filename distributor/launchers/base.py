"""The launcher interface: turn rank specs into running processes under a supervisor.

A launcher says what it can do in `capabilities` (Lightning Fabric's launchers do the same);
placements and the engine read that instead of probing attributes.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, Dict, Sequence

from ..spec import RankSpec
from ..supervisor import Supervisor

#: Builds the full environment of one rank.
EnvFactory = Callable[[RankSpec], Dict[str, str]]


@dataclass(frozen=True)
class LauncherCapabilities:
    """What a launcher supports.

    - `spans_tasks`: one start, in the first Spark task, runs the ranks of every task
      (`start_across_tasks`; mpirun, whose daemons reach the other tasks).
    - `adds_ranks`: `start` may be called again while the job runs, for one more rank (an elastic
      job's replacement worker). A launcher that starts all ranks as one group (mpirun) cannot.
    - `runs_executor_python`: the launcher starts a Python interpreter, which on a Spark executor
      must be the executor's own (`on_executor`).
    - `reports_each_exit`: each rank is a process of its own whose exit status reaches the driver
      when it exits. Under mpirun the statuses come only when mpirun ends, so there a rank that
      closed its hub connection (after its atexit handlers) is taken to have exited.
    """

    spans_tasks: bool = False
    adds_ranks: bool = False
    runs_executor_python: bool = False
    reports_each_exit: bool = False


class Launcher(abc.ABC):
    """Starts the ranks of one host. Implementations differ only in the processes they create."""

    capabilities = LauncherCapabilities()

    def on_executor(self, python: str, driver_python: str) -> None:
        """Adapt to the Spark executor this launcher was shipped to: a rank interpreter that was
        the driver's (`driver_python`, the default) becomes the executor's (`python`), and tools
        are looked up there; called only when `capabilities.runs_executor_python`."""

    def in_reused_worker(self) -> None:
        """Called in a Spark task whose Python worker Spark keeps for later tasks: the launcher
        may keep what speeds up the next job's start there (see `PythonLauncher`)."""

    def keep_warm(self, env: Dict[str, str]) -> None:
        """Called when ranks will be added while the job runs (an elastic job's replacements),
        with the environment of one rank: the launcher may prepare to start them fast until
        `release` (see `PythonLauncher`)."""

    def release(self) -> None:
        """End what `keep_warm` started; called once the job's ranks have ended."""

    @abc.abstractmethod
    def start(self, ranks: Sequence[RankSpec], env_for: EnvFactory, supervisor: Supervisor) -> None:
        """Start every rank of `ranks` under `supervisor`; return without waiting for them."""

    def start_across_tasks(
        self, task_ranks: Sequence[Sequence[RankSpec]], env_for: EnvFactory, supervisor: Supervisor
    ) -> None:
        """From the first Spark task: start the ranks of every task (`task_ranks[i]` are task
        i's); only launchers whose `capabilities.spans_tasks` is True implement it."""
        raise NotImplementedError(f"{type(self).__name__} starts the ranks of one task only")
