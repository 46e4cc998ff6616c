"""Local placement: every rank is a process on this host (the driver-only mode).

`hosts` may give this machine several names with slots ({"host-a": 2, "host-b": 2}): the ranks
are still local processes, but each name is a host of its own for the torchrun variables
(LOCAL_RANK, GROUP_RANK) and for an elastic job (a failed worker's replacement starts on the
same name; discovery may add or remove names). It is how tests and benchmarks exercise multi-host
behaviour on one machine.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Mapping, Optional

from ..errors import LaunchValidationError
from ..rank_env import HUB_ADDRESS_VAR, RANK_VAR, SECRET_VAR, free_port, rank_environment
from ..spec import LaunchRequest, RankSpec
from ..supervisor import Supervisor
from .base import (
    JobContext, Placement, PlacementCapabilities, added_worker_spec, host_plan, stop_in_background,
)


def visible_gpus() -> List[str]:
    """GPU ids this process may use, without importing torch unless it already is."""
    torch = sys.modules.get("torch")
    if torch is not None:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return _ids_from_visible(count)
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return _ids_from_visible(sum(1 for line in listing.splitlines() if line.startswith("GPU ")))


def _ids_from_visible(count: int) -> List[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()][:count] if count else []
    return [str(i) for i in range(count)]


def driver_pythonpath(request_env: Mapping[str, str]) -> str:
    """PYTHONPATH for ranks started from this driver: the caller's own (request env) first, then
    the driver's import paths (its script's folder, a test root), so that modules the target
    imports by name resolve in the ranks as they do here."""
    prefixes = (sys.prefix, sys.base_prefix)
    user_paths = [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(prefixes)]
    parts = [request_env.get("PYTHONPATH"), *user_paths, os.environ.get("PYTHONPATH")]
    return os.pathsep.join(p for p in parts if p)


def driver_side_env(job: JobContext, spec: RankSpec, hub_address: str) -> Dict[str, str]:
    """What a rank started from the driver needs besides the torchrun contract: the way back to
    the hub, the job secret, its rank, and the driver's import paths."""
    env = {HUB_ADDRESS_VAR: hub_address, SECRET_VAR: job.secret.hex(), RANK_VAR: str(spec.rank)}
    pythonpath = driver_pythonpath(job.request.env)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


class LocalPlacement(Placement):
    """Ranks as child processes of the driver, one per rank; `hosts` (name -> slots, in order)
    are names for this machine, filled in order (default: one host holding every rank)."""

    capabilities = PlacementCapabilities(adds_workers=True)

    def __init__(self, hosts: Optional[Mapping[str, int]] = None) -> None:
        self._supervisor: Optional[Supervisor] = None
        self._gpus: List[str] = []
        self.hosts = dict(hosts) if hosts else None
        if self.hosts is not None:
            for name, slots in self.hosts.items():
                if not isinstance(name, str) or not name or isinstance(slots, bool) \
                        or not isinstance(slots, int) or slots < 1:
                    raise LaunchValidationError(
                        f"hosts must map host names to slot counts >= 1, got {name!r}: {slots!r}.")
        self._job: Optional[JobContext] = None
        self._env_for = None

    def _specs(self, n: int) -> List[RankSpec]:
        if self.hosts is None:
            return [RankSpec(rank=r, world_size=n, local_rank=r, local_world_size=n, node_rank=0,
                             num_nodes=1) for r in range(n)]
        return host_plan(list(self.hosts.items()), n)

    def worker_hosts(self, request: LaunchRequest) -> List[str]:
        if self.hosts is None:
            return super().worker_hosts(request)
        names = list(self.hosts)
        return [names[spec.node_rank] for spec in self._specs(request.num_processes)]

    def validate(self, request: LaunchRequest) -> None:
        if self.hosts is not None and sum(self.hosts.values()) < request.num_processes:
            raise LaunchValidationError(
                f"num_processes={request.num_processes} but the hosts {self.hosts} have only "
                f"{sum(self.hosts.values())} slots; add slots or lower num_processes.")
        if not request.use_gpu:
            return
        self._gpus = visible_gpus()
        if not self._gpus:
            raise LaunchValidationError(
                "use_gpu=True but no GPU is visible on this host (nvidia-smi finds none). "
                "Pass use_gpu=False to train on the CPU with the gloo backend."
            )
        if len(self._gpus) < request.num_processes:
            raise LaunchValidationError(
                f"use_gpu=True needs one GPU per rank: num_processes={request.num_processes} but "
                f"only {len(self._gpus)} GPU(s) are visible ({','.join(self._gpus)}). "
                "Lower num_processes or pass use_gpu=False."
            )

    def start(self, job: JobContext) -> None:
        request = job.request
        n = request.num_processes
        # Every rank sees the job's GPUs and picks cuda:LOCAL_RANK, as under torchrun, so that
        # unchanged code doing torch.cuda.set_device(local_rank) finds its own GPU.
        gpus = tuple(self._gpus[:n]) if request.use_gpu else ()
        specs = [dataclasses.replace(spec, gpu_ids=gpus) for spec in self._specs(n)]
        master_port = free_port()
        hub = f"{job.hub_address[0]}:{job.hub_address[1]}"

        def env_for(spec: RankSpec) -> dict:
            env = rank_environment(spec, "127.0.0.1", master_port, job.run_id, request.env)
            env.update(driver_side_env(job, spec, hub))
            return env

        self._supervisor = Supervisor(job.sink)
        self._job, self._env_for = job, env_for
        if request.elastic is not None:
            job.launcher.keep_warm(env_for(specs[0]))
        job.launcher.start(specs, env_for, self._supervisor)

    def add_worker(self, worker_id: int, host: str) -> None:
        if self._job is None or self._supervisor is None or self._env_for is None:
            raise RuntimeError("add_worker is called only after start")
        self._job.launcher.start([added_worker_spec(worker_id)], self._env_for, self._supervisor)

    def stop_worker(self, worker_id: int) -> None:
        stop_in_background(self._supervisor, worker_id)

    def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop()

    def close(self) -> None:
        if self._job is not None:
            self._job.launcher.release()
