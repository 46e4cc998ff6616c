"""The fastest way to start a rank: a Python process running `distributor.rank_entry` directly."""
from __future__ import annotations

import os
import sys
from typing import Sequence

from ..rank_env import PARENT_PID_VAR
from ..spec import RankSpec
from ..supervisor import Supervisor
from .base import EnvFactory, Launcher


class PythonLauncher(Launcher):
    """One `python -m distributor.rank_entry` process per rank."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python

    def start(self, ranks: Sequence[RankSpec], env_for: EnvFactory, supervisor: Supervisor) -> None:
        for spec in ranks:
            env = env_for(spec)
            env[PARENT_PID_VAR] = str(os.getpid())
            supervisor.start(spec.rank, [self.python, "-m", "distributor.rank_entry"], env)
