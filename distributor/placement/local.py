"""Local placement: every rank is a process on this host (the driver-only mode)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, List, Mapping, Optional

from ..errors import LaunchValidationError
from ..rank_env import HUB_ADDRESS_VAR, RANK_VAR, SECRET_VAR, free_port, rank_environment
from ..spec import LaunchRequest, RankSpec
from ..supervisor import Supervisor
from .base import JobContext, Placement


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
    """Ranks as child processes of the driver, one per rank."""

    def __init__(self) -> None:
        self._supervisor: Optional[Supervisor] = None
        self._gpus: List[str] = []

    def validate(self, request: LaunchRequest) -> None:
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
        specs = [
            RankSpec(rank=r, world_size=n, local_rank=r, local_world_size=n, node_rank=0,
                     num_nodes=1, gpu_ids=gpus)
            for r in range(n)
        ]
        master_port = free_port()
        hub = f"{job.hub_address[0]}:{job.hub_address[1]}"

        def env_for(spec: RankSpec) -> dict:
            env = rank_environment(spec, "127.0.0.1", master_port, job.run_id, request.env)
            env.update(driver_side_env(job, spec, hub))
            return env

        self._supervisor = Supervisor(job.sink)
        job.launcher.start(specs, env_for, self._supervisor)

    def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop()
