"""Elastic Horovod jobs on Ray: ``ElasticRayExecutor`` (Horovod 0.28.1 marked it deprecated) and
``RayExecutor(min_workers=...)``, on the same elastic engine as ``horovodrun --min-np``.

- The hosts are Ray's live nodes (`RayHostDiscovery`, asked again every few seconds while the job
  runs): each offers its CPUs divided by the CPUs per worker (and as many GPUs, with
  ``use_gpu``). A node that joins gets workers, up to the maximum; a node that goes has its
  workers stopped, and the others go on.
- Each worker is a process started by a Ray actor of its own on its node, holding its CPUs in
  Ray's accounting (`distributor.placement.ray`). Inside, ``hvd.elastic.run`` has its usual
  meaning: a worker that dies (its process, its actor or its node) makes the others restore the
  last commit of their ``TorchState`` and go on, and a replacement starts where there is room.
- ``run(fn)`` returns the values of the workers of the last round, in rank order; the job fails
  as ``horovodrun`` elastic jobs do (the same training error twice, ``reset_limit`` resets, or
  fewer than the minimum of workers for ``elastic_timeout`` seconds), with an error that lists
  every failed attempt.

Not carried over: Horovod's ``callbacks`` got values that rank 0 put on a queue of Ray Tune's;
here they are accepted and never called (a warning says so).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..launch.common.util import secret
from ..launch.elastic import DEFAULT_ELASTIC_TIMEOUT, ElasticArgs, wait_for_slots
from ..launch.hosts import is_local, local_addresses

__all__ = ["ElasticRayExecutor", "ElasticSettings", "RayHostDiscovery", "run_elastic"]


class RayHostDiscovery:
    """Horovod's discovery from Ray's state: {node address: slots} for every live node, a slot
    being `cpus_per_slot` CPUs (and `gpus_per_slot` GPUs with `use_gpu`) of the node's total."""

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: float = 1) -> None:
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = use_gpu, cpus_per_slot, gpus_per_slot

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        import ray

        hosts: Dict[str, int] = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            slots = resources.get("CPU", 0) // self.cpus_per_slot
            if self.use_gpu:
                slots = min(slots, resources.get("GPU", 0) // self.gpus_per_slot)
            if slots >= 1:
                hosts[node["NodeManagerAddress"]] = int(slots)
        return hosts

    __call__ = find_available_hosts_and_slots  # what the elastic engine calls


@dataclasses.dataclass
class ElasticSettings:
    """What ``ElasticRayExecutor.create_settings`` returns (Horovod's fields of that name)."""

    discovery: Any = None
    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Tuple[int, int]] = None
    num_proc: int = 1
    #: seconds every worker's ``hvd.init()`` may wait for the others (Horovod's start timeout)
    timeout_s: float = 30
    ssh_identity_file: Optional[str] = None
    nics: Optional[set] = None
    verbose: int = 0
    key: bytes = b""


def run_elastic(fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any], *,
                settings: ElasticSettings, discovery: Callable[[], Dict[str, int]],
                cpus_per_worker: float, gpus_per_worker: float,
                env: Optional[Dict[str, Any]] = None) -> List[Any]:
    """`fn(*args, **kwargs)` as an elastic job on the Ray nodes `discovery` offers; the values of
    the workers of its last round, in rank order."""
    import ray

    from distributor.placement import RayPlacement

    from ..launch.job import HorovodJob

    if not ray.is_initialized():
        ray.init()
    most = settings.max_num_proc
    need, timeout = settings.min_num_proc, settings.elastic_timeout
    hosts = wait_for_slots(
        discovery, need, timeout,
        lambda hosts: (f"horovod.ray: waiting up to {timeout:g} s for the Ray cluster to offer {need} "
                       f"worker slot(s); it offers {sum(hosts.values())} ({hosts})"),
        lambda hosts: (f"horovod.ray: the Ray cluster offers {sum(hosts.values())} worker slot(s) "
                       f"({hosts or 'no live node with room'}), fewer than the minimum of {need}, "
                       f"after {timeout:g} s: add nodes, lower the minimum, or ask for fewer CPUs "
                       "per worker"))
    # start on every slot there is (up to the maximum), not on the minimum and grow at once
    num_proc = max(settings.min_num_proc, min(sum(hosts.values()), most or math.inf))
    elastic = ElasticArgs(min_num_proc=settings.min_num_proc, max_num_proc=most,
                          reset_limit=settings.reset_limit, cooldown_range=settings.cooldown_range,
                          elastic_timeout=settings.elastic_timeout)
    job = HorovodJob.create(num_proc, hosts=",".join(f"{h}:{n}" for h, n in hosts.items()),
                            env={k: str(v) for k, v in (env or {}).items()},
                            start_timeout=settings.timeout_s, verbose=bool(settings.verbose),
                            nics=sorted(settings.nics) if settings.nics else None, elastic=elastic)
    job = dataclasses.replace(job, elastic=dataclasses.replace(job.elastic, discovery=discovery))
    local = local_addresses()
    placement = RayPlacement(job.hosts, num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
                             is_local=lambda host: is_local(host, local))
    return job.run(job.function_target(fn, tuple(args), dict(kwargs)), placement=placement)


def _warn_callbacks(callbacks: Optional[List[Callable]]) -> None:
    if callbacks:
        warnings.warn("horovod.ray: the callbacks of an elastic run are not called here (Horovod "
                      "passed them values rank 0 put on a Ray Tune queue); see docs/ray.md",
                      UserWarning, stacklevel=3)


class ElasticRayExecutor:
    """Horovod 0.28.1's ``horovod.ray.ElasticRayExecutor`` (deprecated there in favour of
    ``RayExecutor(min_workers=...)``, which runs the same way): see the module's docstring."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None,
                        reset_limit: Optional[int] = None, elastic_timeout: int = DEFAULT_ELASTIC_TIMEOUT,
                        timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[set] = None, min_np: Optional[int] = None,
                        max_np: Optional[int] = None, verbose: int = 0,
                        cooldown_range: Optional[Sequence[int]] = None) -> ElasticSettings:
        """The job's settings; ``discovery`` is set by the executor (Ray's live nodes)."""
        for old, new in (("min_np", "min_num_proc"), ("max_np", "max_num_proc")):
            if locals()[old] is not None:
                warnings.warn(f"{old} is deprecated, use {new} instead", DeprecationWarning, stacklevel=2)
        min_num_proc = min_np if min_np is not None else min_num_proc
        max_num_proc = max_np if max_np is not None else max_num_proc
        from ..launch.elastic import check_elastic_args

        check_elastic_args(None, min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                           reset_limit=reset_limit, cooldown_range=cooldown_range,
                           elastic_timeout=elastic_timeout)
        return ElasticSettings(min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                               elastic_timeout=elastic_timeout, reset_limit=reset_limit,
                               cooldown_range=tuple(cooldown_range) if cooldown_range else None,
                               num_proc=min_num_proc, timeout_s=timeout_s,
                               ssh_identity_file=ssh_identity_file, nics=nics, verbose=verbose,
                               key=secret.make_secret_key())

    def __init__(self, settings: ElasticSettings, use_gpu: bool = False, cpus_per_slot: int = 1,
                 gpus_per_slot: Optional[int] = None, env_vars: Optional[dict] = None,
                 override_discovery: bool = True) -> None:
        if gpus_per_slot and not use_gpu:
            raise ValueError("ElasticRayExecutor(gpus_per_slot=...) needs use_gpu=True")
        gpus_per_slot = gpus_per_slot or int(use_gpu)
        if use_gpu and gpus_per_slot < 1:
            raise ValueError(f"ElasticRayExecutor(gpus_per_slot={gpus_per_slot}): at least 1 with use_gpu=True")
        if isinstance(cpus_per_slot, bool) or not isinstance(cpus_per_slot, int) or cpus_per_slot < 1:
            raise ValueError(f"ElasticRayExecutor(cpus_per_slot={cpus_per_slot!r}): a positive whole number")
        if override_discovery or settings.discovery is None:
            settings.discovery = RayHostDiscovery(use_gpu, cpus_per_slot, gpus_per_slot)
        self.settings, self.use_gpu = settings, use_gpu
        self.cpus_per_slot, self.gpus_per_slot = cpus_per_slot, gpus_per_slot if use_gpu else 0
        self.env_vars = dict(env_vars or {})
        self._started = False

    def start(self) -> None:
        """Connect to Ray (``ray.init()`` unless the caller did); the workers start in `run`.
        GPUs asked of a cluster that has none is a ValueError here, before any actor starts."""
        import ray

        if not ray.is_initialized():
            ray.init()
        if self.use_gpu and not ray.cluster_resources().get("GPU"):
            raise ValueError("ElasticRayExecutor(use_gpu=True): the Ray cluster has no GPUs "
                             f"(ray.cluster_resources(): {ray.cluster_resources()}); pass "
                             "use_gpu=False, or add nodes with GPUs")
        self._started = True

    def run(self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``worker_fn()`` in every worker, elastically; the last round's values in rank order."""
        if not self._started:
            raise RuntimeError("ElasticRayExecutor.run(): call start() first")
        _warn_callbacks(callbacks)
        return run_elastic(worker_fn, (), {}, settings=self.settings, discovery=self.settings.discovery,
                           cpus_per_worker=self.cpus_per_slot, gpus_per_worker=self.gpus_per_slot,
                           env=self.env_vars)
