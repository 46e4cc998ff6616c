"""The environment contract every rank gets: what torchrun sets, so that unchanged code works.

`torch.distributed.init_process_group(backend, init_method="env://")` needs RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT. Lightning and Hugging Face detect an external launcher from
TORCHELASTIC_RUN_ID together with LOCAL_RANK, GROUP_RANK and LOCAL_WORLD_SIZE.
"""
from __future__ import annotations

import os
import re
import secrets
import socket
from typing import Dict, Mapping, Sequence, Tuple

from .spec import RankSpec

#: Variables the engine uses to reach its rank entry point; removed from the rank's os.environ
#: before user code runs.
HUB_ADDRESS_VAR = "DISTRIBUTOR_HUB_ADDRESS"
SECRET_VAR = "DISTRIBUTOR_JOB_SECRET"
RANK_VAR = "DISTRIBUTOR_RANK"
PARENT_PID_VAR = "DISTRIBUTOR_PARENT_PID"
GPU_IDS_VAR = "DISTRIBUTOR_GPU_IDS"  # under mpirun: the host's GPUs, cuda:LOCAL_RANK is a rank's
#: Under an mpirun over several hosts: every rank's place, host by host (see `hosts_layout`).
LAYOUT_VAR = "DISTRIBUTOR_HOSTS_LAYOUT"
PRIVATE_VARS = (HUB_ADDRESS_VAR, SECRET_VAR, RANK_VAR, PARENT_PID_VAR, GPU_IDS_VAR, LAYOUT_VAR)

#: The variables `torchrun_env` sets that differ between jobs or ranks (all but PYTHONUNBUFFERED).
TORCHRUN_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "CUDA_VISIBLE_DEVICES",
)

#: Per-rank variables of the torchrun contract; a launcher that starts several ranks from one
#: environment (mpirun) leaves them to `from_mpi_environment` in each rank.
PER_RANK_VARS = ("RANK", "LOCAL_RANK", "ROLE_RANK", "GROUP_RANK", "NODE_RANK", "CUDA_VISIBLE_DEVICES")


#: Variables of the driver's shell that do not describe the job: they stay behind when a rank
#: starts on another host (as do names that are not shell identifiers).
_SHELL_ONLY = re.compile(r"^(BASH_FUNC_.*|OLDPWD|PWD|SHLVL|_|SSH_.*|HOSTNAME|TERM|DISPLAY|TMUX.*"
                         r"|PS1|MAIL|LS_COLORS)$")
_SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def travels_to_other_hosts(name: str) -> bool:
    """Whether the driver's variable `name` goes along to ranks on other hosts (everything but
    the shell's own variables, as Horovod's launchers forward the driver's environment)."""
    return bool(_SHELL_NAME.match(name)) and not _SHELL_ONLY.match(name)


#: Linux's range of ports it gives to sockets bound to port 0 and to outgoing connections.
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host`, which a process started later binds.

    Outside the range of ephemeral ports where the system has one below it: a port the kernel
    handed out (bind to port 0) is taken again by the next outgoing connection that gets it as
    its local port, and a busy machine opens thousands between the choice and the bind (EADDRINUSE
    in the rank that hosts the job's store). Ports below the range are only ever bound by name.
    """
    low = _ephemeral_low()
    for _ in range(64 if low > 2048 else 0):
        port = 1024 + secrets.randbelow(low - 1024)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:  # in use (or not ours to bind): another
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _ephemeral_low() -> int:
    """The lowest ephemeral port, 0 where unknown."""
    try:
        with open(_EPHEMERAL_RANGE_FILE) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def torchrun_env(
    spec: RankSpec, master_addr: str, master_port: int, run_id: str
) -> Dict[str, str]:
    """The variables torchrun would set for this rank."""
    env = {
        "RANK": str(spec.rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_RANK": str(spec.local_rank),
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "GROUP_RANK": str(spec.node_rank),
        "NODE_RANK": str(spec.node_rank),
        "GROUP_WORLD_SIZE": str(spec.num_nodes),
        "ROLE_RANK": str(spec.rank),
        "ROLE_WORLD_SIZE": str(spec.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "PYTHONUNBUFFERED": "1",
    }
    if spec.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpu_ids)
    return env


def rank_environment(
    spec: RankSpec,
    master_addr: str,
    master_port: int,
    run_id: str,
    user_env: Mapping[str, str],
    base: Mapping[str, str] = os.environ,
) -> Dict[str, str]:
    """The full environment of a rank process: inherited, then torchrun's, then the user's."""
    env = dict(base)
    for name in PRIVATE_VARS:
        env.pop(name, None)
    env.update(torchrun_env(spec, master_addr, master_port, run_id))
    if spec.local_world_size > 1 and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = "1"  # as torchrun does, so N ranks don't oversubscribe the cores
    env.update(user_env)
    return env


def hosts_layout(hosts: Sequence[Tuple[str, int]]) -> str:
    """`LAYOUT_VAR`'s value for an mpirun that fills `hosts` [(name, ranks)] in order
    (`--map-by slot`): per host, its rank count."""
    return ",".join(str(count) for _, count in hosts)


def _from_layout(rank: int, layout: str, environ: Mapping[str, str]) -> Dict[str, str]:
    counts = [int(c) for c in layout.split(",")]
    node, first = 0, 0
    while rank >= first + counts[node]:
        first += counts[node]
        node += 1
    env = {
        "RANK": str(rank), "WORLD_SIZE": str(sum(counts)), "LOCAL_RANK": str(rank - first),
        "LOCAL_WORLD_SIZE": str(counts[node]), "GROUP_RANK": str(node), "NODE_RANK": str(node),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(sum(counts)),
        "GROUP_WORLD_SIZE": str(len(counts)),
    }
    if environ.get(GPU_IDS_VAR):
        env["CUDA_VISIBLE_DEVICES"] = environ[GPU_IDS_VAR]
    return env


def from_mpi_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """The torchrun variables of a rank started by mpirun, from what MPI set.

    With `LAYOUT_VAR` (an mpirun over several hosts, possibly uneven) the rank's place comes from
    that layout: MPI's own local size is not per host in every version (Open MPI 5 reports the
    largest host's). Otherwise Open MPI sets OMPI_COMM_WORLD_*; MPICH and Intel MPI set
    PMI_RANK/PMI_SIZE (and MPI_LOCALRANKID), and ranks are laid out host by host
    (`--map-by slot`), so the host index is rank // local size. Returns {} when the process was
    not started by MPI.
    """
    layout = environ.get(LAYOUT_VAR)
    mpi_rank = environ.get("OMPI_COMM_WORLD_RANK", environ.get("PMI_RANK"))
    if layout and mpi_rank is not None:
        return _from_layout(int(mpi_rank), layout, environ)
    if "OMPI_COMM_WORLD_RANK" in environ:
        rank = int(environ["OMPI_COMM_WORLD_RANK"])
        size = int(environ["OMPI_COMM_WORLD_SIZE"])
        local_rank = int(environ.get("OMPI_COMM_WORLD_LOCAL_RANK", rank))
        local_size = int(environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", size))
    elif "PMI_RANK" in environ:
        rank, size = int(environ["PMI_RANK"]), int(environ["PMI_SIZE"])
        local_rank = int(environ.get("MPI_LOCALRANKID", rank))
        local_size = int(environ.get("MPI_LOCALNRANKS", size))
    else:
        return {}
    node_rank = rank // max(local_size, 1)
    env = {
        "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(size),
        "GROUP_WORLD_SIZE": str(max(size // max(local_size, 1), 1)),
    }
    gpus = environ.get(GPU_IDS_VAR, "")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus  # the host's GPUs; the rank uses cuda:LOCAL_RANK
    return env
