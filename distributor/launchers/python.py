"""The fastest way to start a rank: a Python process running `distributor.rank_entry` directly."""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Sequence

from .. import forkserver, forkserver_daemon
from ..rank_env import PARENT_PID_VAR
from ..spec import RankSpec
from ..supervisor import Supervisor
from .base import EnvFactory, Launcher, LauncherCapabilities


class PythonLauncher(Launcher):
    """One `python -m distributor.rank_entry` process per rank.

    `preload` names modules every rank imports anyway (torch, for a PyTorch front end). In a Spark
    task whose Python worker is reused, the ranks are then forked from a warm `forkserver` that
    imported them once for every later job of that worker (and that imports, when a later job
    uses it, the TensorFlow a rank of an earlier job imported: `forkserver.LEARNED`). In a job that
    adds ranks while it runs (`keep_warm`: an elastic job), the ranks are forked from a fork server
    of that job, so a replacement rank starts with its modules already imported. With
    `across_launches` (a launch from the command line or a script, on this host), the ranks are
    forked from this user's `forkserver_daemon`, which stays after the launch with what its ranks
    imported (torch, TensorFlow) for the next one. Elsewhere, or where no server can be used, they
    are plain processes.
    """

    capabilities = LauncherCapabilities(adds_ranks=True, runs_executor_python=True,
                                        reports_each_exit=True)

    def __init__(self, python: str = sys.executable, preload: Sequence[str] = (),
                 across_launches: Optional[forkserver_daemon.DaemonSettings] = None) -> None:
        self.python = python
        self.preload = tuple(preload)
        self.across_launches = across_launches
        self._warm = False
        self._job_server: Optional[forkserver.ForkServer] = None
        self._daemon: Optional[forkserver.ForkServer] = None
        self._daemon_tried = False

    def on_executor(self, python: str, driver_python: str) -> None:
        if self.python == driver_python:  # the default: run the executor's interpreter
            self.python = python

    def in_reused_worker(self) -> None:
        self._warm = bool(self.preload)

    def keep_warm(self, env: Dict[str, str]) -> None:
        if self._job_server is None:
            self._job_server = forkserver.ForkServer(self.python, self.preload, env, os.getcwd())

    def release(self) -> None:
        for server in (self._job_server, self._daemon):
            if server is not None:
                server.close()
        self._job_server = self._daemon = None

    def _fork(self, env: Dict[str, str]) -> Optional[forkserver.ForkedProcess]:
        if self.across_launches is not None and not self._daemon_tried:
            self._daemon_tried = True
            self._daemon = forkserver_daemon.connect(self.python, env, self.across_launches)
        for server, cwd in ((self._job_server, None), (self._daemon, os.getcwd())):
            if server is not None and server.usable:
                try:
                    return server.spawn(env, cwd)
                except OSError:
                    return None
        return forkserver.spawn_warm(self.python, self.preload, env) if self._warm else None

    def command(self) -> List[str]:
        """The command line of one rank process (also run on other hosts over ssh)."""
        return [self.python, "-m", "distributor.rank_entry"]

    def start(self, ranks: Sequence[RankSpec], env_for: EnvFactory, supervisor: Supervisor) -> None:
        for spec in ranks:
            env = env_for(spec)
            env[PARENT_PID_VAR] = str(os.getpid())
            forked = self._fork(env)
            if forked is not None:
                supervisor.track(spec.rank, forked)
            else:
                supervisor.start(spec.rank, self.command(), env)
