"""``horovod.ray.RayExecutor`` on Ray 2.x: ranks are Ray actors placed in a placement group, and
inside them ``hvd.init()`` runs this project's runtime, as under every other launcher.

What happens at ``start()``:

1. The request is checked against the cluster (``ray.cluster_resources()``, ``ray.nodes()``) before
   anything is placed: more CPUs or GPUs than the cluster has, or more hosts than it has nodes
   with room, is a ``ValueError`` that says which number to change.
2. One placement group: ``num_workers`` bundles of ``cpus_per_worker`` CPUs (and GPUs), PACK; or
   ``num_hosts`` bundles of ``num_workers_per_host`` workers each, STRICT_SPREAD (one per node).
   Inside a placement group already (Ray Train's), that one is used unless
   ``use_current_placement_group=False``. Not ready within ``placement_group_timeout_s``: a
   ``TimeoutError`` naming the bundles and what the cluster has free.
3. One actor per rank (``BaseHorovodWorker``), scheduled into the group's bundles. Each says its
   node; ranks are then numbered node by node, so local ranks are contiguous (cross rank =
   the node's index among the nodes that have that local rank, as Horovod counts it).
4. Every actor gets Horovod's environment (``HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/
   CROSS_SIZE``), ``MASTER_ADDR`` = rank 0's node and ``MASTER_PORT`` = a port free there (the
   rendezvous store rank 0's ``hvd.init()`` opens), ``extra_env_vars``, and its executable.

``run``/``execute`` then call the function in every actor and return the values in rank order. When
a rank raises, or its actor dies, the other ranks may be waiting for it inside a collective: every
actor is stopped at once and the error is raised on the caller, with the rank, its node and its
traceback (a note added to Ray's own exception, so ``except ray.exceptions.RayTaskError`` code keeps
working). The executor then has no workers: ``start()`` again to go on. ``run_remote`` hands back
Ray's ObjectRefs and leaves such errors to the caller's ``ray.get``.

Elastic jobs (``min_workers=``, and ``ElasticRayExecutor``) run ``run(fn)`` on the elastic engine
of ``horovodrun --min-np``, each worker a process that an actor of its own starts on its node:
``horovod_compat.ray.elastic``.
"""
from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence

from .utils import nics_to_env_var
from .worker import BaseHorovodWorker, RankFunctionError

__all__ = ["RayExecutor", "MiniSettings", "Coordinator"]


@dataclasses.dataclass
class MiniSettings:
    """What ``RayExecutor.create_settings`` returns (Horovod's name and fields)."""

    nics: Optional[set] = None
    verbose: int = 1
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    #: the rendezvous (``hvd.init()``) timeout of every rank
    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    elastic: bool = False


#: How long the other ranks get to show the cause when the first failure is a consequence.
_CULPRIT_GRACE_SECONDS = 5.0


def _blame(exc: BaseException) -> int:
    """0: the rank's actor died; 1: the rank's function raised an error of its own; 2: it raised
    HorovodInternalError (a peer went away: a consequence) or something Ray says of it."""
    import ray

    if isinstance(exc, ray.exceptions.RayActorError):
        return 0
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RankFunctionError) and cause.kind != "HorovodInternalError":
        return 1
    return 2


def _what(exc: BaseException) -> str:
    """What happened to a rank, for the note on the raised error."""
    if _blame(exc) == 0:
        return "died (its actor process is gone)"
    return f"raised {getattr(getattr(exc, 'cause', None), 'kind', type(exc).__name__)}"


class Coordinator:
    """Horovod's rank topology from where each rank runs, and the job's rendezvous (Horovod's
    ``horovod.ray.runner.Coordinator``, which Ray Train's Horovod backend drives).

    ``register(hostname, node_id, world_rank)`` for every rank, then ``finalize_registration()``:
    each rank's ``HOROVOD_LOCAL_RANK/LOCAL_SIZE`` (its index among the ranks of its node) and
    ``HOROVOD_CROSS_RANK/CROSS_SIZE`` (its node's index among the nodes that have that local rank),
    with the torchrun names of the same facts. ``establish_rendezvous()`` opens the job's store in
    this process (where Horovod started its rendezvous server) and returns what every rank needs to
    reach it; the store lives as long as this object."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.node_id_by_rank: "OrderedDict[str, List[int]]" = OrderedDict()
        self._hostnames: Dict[str, None] = {}
        self.store = None

    @property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.node_id_by_rank.values())

    @property
    def hostnames(self) -> List[str]:
        return list(self._hostnames)

    @property
    def node_id_string(self) -> str:
        return ",".join(f"{node}:{len(ranks)}" for node, ranks in self.node_id_by_rank.items())

    def register(self, hostname: str, node_id: str, world_rank: int) -> None:
        self._hostnames[hostname] = None
        self.node_id_by_rank.setdefault(node_id, []).append(world_rank)

    def finalize_registration(self) -> Dict[int, Dict[str, int]]:
        size = self.world_size
        cross_sizes: Dict[int, int] = {}
        info: Dict[int, Dict[str, int]] = {}
        for node, ranks in enumerate(self.node_id_by_rank.values()):
            for local_rank, rank in enumerate(ranks):
                info[rank] = dict(HOROVOD_LOCAL_RANK=local_rank, HOROVOD_LOCAL_SIZE=len(ranks),
                                  HOROVOD_CROSS_RANK=cross_sizes.get(local_rank, 0),
                                  RANK=rank, WORLD_SIZE=size, LOCAL_RANK=local_rank,
                                  LOCAL_WORLD_SIZE=len(ranks), GROUP_RANK=node)
                cross_sizes[local_rank] = cross_sizes.get(local_rank, 0) + 1
        for env in info.values():
            env["HOROVOD_CROSS_SIZE"] = cross_sizes[env["HOROVOD_LOCAL_RANK"]]
        return info

    def establish_rendezvous(self) -> Dict[str, str]:
        """Open the job's store here (torch's TCPStore, every rank a client of it, as under
        torchrun's agent) and return its address for every rank."""
        from datetime import timedelta

        import ray
        import torch.distributed as dist

        address = ray.util.get_node_ip_address()
        timeout = float(getattr(self.settings, "timeout_s", 300))
        self.store = dist.TCPStore(address, 0, None, True, timedelta(seconds=timeout), wait_for_workers=False)
        return {"MASTER_ADDR": address, "MASTER_PORT": str(self.store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True", "HOROVOD_COMPAT_INIT_TIMEOUT": str(timeout)}


class RayExecutor:
    """Horovod 0.28.1's ``horovod.ray.RayExecutor``: see the module's docstring."""

    @classmethod
    def create_settings(cls, timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: int = 100,
                        nics: Optional[set] = None) -> MiniSettings:
        """Settings for a RayExecutor. `ssh_str`, a private key, is written to
        `ssh_identity_file` (mode 0600) when that file does not exist yet, as Horovod did; ranks
        here are reached through Ray, not ssh. `nics`: the interfaces the ranks may use."""
        if ssh_str and not ssh_identity_file:
            raise ValueError("create_settings(ssh_str=...) needs ssh_identity_file=, the file to write the key to")
        if ssh_str and not os.path.exists(ssh_identity_file):
            with open(os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(ssh_str)
        return MiniSettings(ssh_identity_file=ssh_identity_file, timeout_s=timeout_s,
                            placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings: MiniSettings, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: int = 1, use_gpu: bool = False, gpus_per_worker: Optional[int] = None,
                 use_current_placement_group: bool = True, min_workers: Optional[int] = None,
                 max_workers: Optional[int] = None, reset_limit: Optional[int] = None,
                 cooldown_range: Optional[List[int]] = None, elastic_timeout: int = 600,
                 override_discovery: bool = True) -> None:
        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError("RayExecutor(max_workers=...) needs a positive min_workers=: an elastic "
                             "job runs between the two")
        if min_workers and num_workers:
            raise ValueError("RayExecutor: give num_workers= (a fixed-size job) or min_workers= "
                             "(an elastic one), not both")
        if gpus_per_worker and not use_gpu:
            raise ValueError("RayExecutor(gpus_per_worker=...) needs use_gpu=True")
        if use_gpu and isinstance(gpus_per_worker, int) and gpus_per_worker < 1:
            raise ValueError(f"RayExecutor(gpus_per_worker={gpus_per_worker}): at least 1 with use_gpu=True")
        for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                            ("num_workers_per_host", num_workers_per_host), ("cpus_per_worker", cpus_per_worker)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"RayExecutor({name}={value!r}): a positive whole number")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("RayExecutor: give num_workers= or num_hosts= (with num_workers_per_host=), not both")
        self._elastic: Optional[Any] = None
        if min_workers is not None:
            if num_hosts is not None:
                raise ValueError("RayExecutor: an elastic job (min_workers=) places its workers on "
                                 "every live node; drop num_hosts=")
            from .elastic import ElasticRayExecutor

            self._elastic = ElasticRayExecutor.create_settings(
                min_num_proc=min_workers, max_num_proc=max_workers, reset_limit=reset_limit,
                elastic_timeout=elastic_timeout, timeout_s=settings.timeout_s, nics=settings.nics,
                verbose=settings.verbose, cooldown_range=cooldown_range)
            self._elastic.discovery = getattr(settings, "discovery", None)
            self._override_discovery = override_discovery
        self._elastic_env: Optional[Dict[str, Any]] = None  # set by start()
        self.settings = settings
        self.num_workers, self.num_hosts, self.num_workers_per_host = num_workers, num_hosts, num_workers_per_host
        self.cpus_per_worker, self.use_gpu = cpus_per_worker, use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers: List[Any] = []
        self._placement_group = None
        self._own_placement_group = False
        self._hosts: List[str] = []

    # -- start --------------------------------------------------------------------------------
    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Place the actors, give each its rank's environment, and create its executable."""
        import ray
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.workers:
            raise RuntimeError("RayExecutor.start(): already started; shutdown() first")
        if not ray.is_initialized():
            ray.init()
        if self._elastic is not None:
            if executable_cls is not None:
                raise ValueError("RayExecutor(min_workers=...): an elastic job runs functions "
                                 "(run(fn)), not an executable_cls; its workers change as it runs")
            self._elastic_env = dict(extra_env_vars or {})
            self._check_resources(self._elastic.min_num_proc)
            return
        current = get_current_placement_group() if self.use_current_placement_group else None
        if self.num_workers is None and self.num_hosts is None and current is None:
            raise ValueError("RayExecutor: say how many ranks: num_workers=, or num_hosts= with "
                             "num_workers_per_host=")
        count = self.num_workers or (self.num_workers_per_host * self.num_hosts if self.num_hosts
                                     else len(current.bundle_specs))
        if current is None:
            self._check_resources(count)
        group, bundle_of = self._placement(current, count)
        actor = ray.remote(BaseHorovodWorker)
        options = dict(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker)
        workers = [actor.options(**options, scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=bundle_of(i))).remote(i, count) for i in range(count)]
        try:
            self._arrange(workers, extra_env_vars or {})
            ray.get([w.start_executable.remote(executable_cls, executable_args or [], executable_kwargs or {})
                     for w in self.workers])
        except BaseException:
            self.workers = workers
            self.shutdown()
            raise

    def _check_resources(self, count: int) -> None:
        import ray

        have = ray.cluster_resources()
        need = {"CPU": count * self.cpus_per_worker, "GPU": count * self.gpus_per_worker}
        shape = (f"min_workers={count}" if self._elastic is not None
                 else f"num_workers={self.num_workers}" if self.num_workers
                 else f"num_hosts={self.num_hosts} x num_workers_per_host={self.num_workers_per_host}")
        for kind, amount in need.items():
            if amount and have.get(kind, 0) < amount:
                fix = ("use_gpu=False, or a cluster with GPUs" if kind == "GPU" and not have.get("GPU")
                       else f"fewer workers, fewer {kind}s per worker, or more nodes")
                raise ValueError(f"RayExecutor({shape}, cpus_per_worker={self.cpus_per_worker}"
                                 f"{f', gpus_per_worker={self.gpus_per_worker}' if self.use_gpu else ''}) needs "
                                 f"{amount:g} {kind}s; the Ray cluster has {have.get(kind, 0):g} "
                                 f"(ray.cluster_resources()): {fix}")
        if self.num_hosts:
            per_host = {"CPU": self.num_workers_per_host * self.cpus_per_worker,
                        "GPU": self.num_workers_per_host * self.gpus_per_worker}
            roomy = [n for n in ray.nodes() if n.get("Alive") and all(
                n.get("Resources", {}).get(k, 0) >= v for k, v in per_host.items() if v)]
            if len(roomy) < self.num_hosts:
                raise ValueError(f"RayExecutor(num_hosts={self.num_hosts}) puts {self.num_workers_per_host} "
                                 f"worker(s) on each of {self.num_hosts} nodes, but only {len(roomy)} node(s) "
                                 f"of the Ray cluster have {per_host['CPU']} CPUs"
                                 + (f" and {per_host['GPU']} GPUs" if self.use_gpu else "")
                                 + ": lower num_hosts, or add nodes")

    def _placement(self, current: Any, count: int):
        """The placement group (created here unless `current`) and the bundle of each worker."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        if current is not None:
            self._placement_group, self._own_placement_group = current, False
            return current, lambda i: i % len(current.bundle_specs)
        if self.num_hosts:
            per = self.num_workers_per_host
            bundle = {"CPU": self.cpus_per_worker * per, **({"GPU": self.gpus_per_worker * per} if self.use_gpu else {})}
            group = placement_group([dict(bundle) for _ in range(self.num_hosts)], strategy="STRICT_SPREAD")
            bundle_of = lambda i: i // per  # noqa: E731
        else:
            bundle = {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.use_gpu else {})}
            group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK")
            bundle_of = lambda i: i  # noqa: E731
        self._placement_group, self._own_placement_group = group, True
        timeout = self.settings.placement_group_timeout_s
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            self._placement_group = None
            raise TimeoutError(
                f"RayExecutor: the placement group ({len(group.bundle_specs)} bundles of {bundle}, "
                f"{'STRICT_SPREAD' if self.num_hosts else 'PACK'}) was not ready after {timeout} s; the "
                f"cluster has {ray.available_resources()} free of {ray.cluster_resources()}. Free "
                "resources, ask for fewer, or raise create_settings(placement_group_timeout_s=...)") from None
        return group, bundle_of

    def _arrange(self, workers: List[Any], extra: Dict[str, Any]) -> None:
        """Number the ranks node by node (Coordinator) and give each actor its environment, with
        rank 0's node as the rendezvous: a port free there, for the store its hvd.init() opens."""
        import ray

        where = ray.get([w.placement.remote() for w in workers])
        nodes: "OrderedDict[str, List[int]]" = OrderedDict()
        for index, (node, *_rest) in enumerate(where):
            nodes.setdefault(node, []).append(index)
        order = [index for indexes in nodes.values() for index in indexes]
        self.workers = [workers[i] for i in order]
        self._hosts = [where[i][1] for i in order]
        self._pids = [where[i][3] for i in order]
        coordinator = Coordinator(self.settings)
        for rank, index in enumerate(order):
            coordinator.register(where[index][1], where[index][0], rank)
        topology = coordinator.finalize_registration()
        address = where[order[0]][2]
        port = ray.get(self.workers[0].free_port.remote(address))
        common = {"HOROVOD_SIZE": len(order), "MASTER_ADDR": address, "MASTER_PORT": port,
                  "HOROVOD_COMPAT_INIT_TIMEOUT": self.settings.timeout_s,
                  **nics_to_env_var(self.settings.nics)}
        ray.get([w.update_env_vars.remote({**topology[rank], **common, "HOROVOD_RANK": rank, **extra})
                 for rank, w in enumerate(self.workers)])

    # -- run ----------------------------------------------------------------------------------
    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every rank; the values in rank order. (`callbacks` served
        Horovod's elastic jobs; a fixed-size job takes and ignores them, as Horovod's did.)"""
        return self._gather([w.execute.remote(fn) for w in self._started()])

    def run(self, fn: Callable[..., Any], args: Optional[Sequence] = None,
            kwargs: Optional[Dict[str, Any]] = None, callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the values in rank order (an elastic job's: the
        values of its last round's workers, horovod_compat.ray.elastic)."""
        if self._elastic is not None:
            from .elastic import RayHostDiscovery, _warn_callbacks, run_elastic

            if self._elastic_env is None:
                raise RuntimeError("RayExecutor.run(): call start() first")
            _warn_callbacks(callbacks)
            discovery = self._elastic.discovery
            if self._override_discovery or discovery is None:
                discovery = RayHostDiscovery(self.use_gpu, self.cpus_per_worker, self.gpus_per_worker or 1)
            return run_elastic(fn, list(args or ()), dict(kwargs or {}), settings=self._elastic,
                               discovery=discovery, cpus_per_worker=self.cpus_per_worker,
                               gpus_per_worker=self.gpus_per_worker, env=self._elastic_env)
        return self._gather(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn: Callable[..., Any], args: Optional[Sequence] = None,
                   kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank, without waiting: one ObjectRef per rank."""
        args, kwargs = list(args or ()), dict(kwargs or {})
        return [w.execute.remote(lambda _executable: fn(*args, **kwargs)) for w in self._started()]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""
        return self._gather([self._started()[0].execute.remote(fn)])[0]

    def _started(self) -> List[Any]:
        if self._elastic is not None:
            raise RuntimeError("RayExecutor(min_workers=...): an elastic job runs functions with "
                               "run(fn, args, kwargs); execute, execute_single and run_remote need "
                               "a fixed set of workers (num_workers=)")
        if not self.workers:
            raise RuntimeError("RayExecutor: no workers (never started, shut down, or stopped after a "
                               "rank failed): call start() first")
        return self.workers

    def _gather(self, refs: List[Any]) -> List[Any]:
        """The values of `refs` (one per rank, in rank order); at the first failure every actor is
        stopped, so that no rank stays waiting for the failed one, and the culprit's failure is
        raised: when the first failure is a consequence (a rank's HorovodInternalError: a peer
        went away under it), the others get `_CULPRIT_GRACE_SECONDS` to show the cause (an actor
        that died, or a rank's own error), as every other launcher names the rank that failed
        first, not the ones that saw it go."""
        import ray

        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as exc:
                failures = {refs.index(ready[0]): exc}
                if _blame(exc) == 2 and pending:
                    more, _ = ray.wait(pending, num_returns=len(pending), timeout=_CULPRIT_GRACE_SECONDS)
                    for ref in more:
                        try:
                            ray.get(ref)
                        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as other:
                            failures[refs.index(ref)] = other
                rank = min(failures, key=lambda r: (_blame(failures[r]), r))
                culprit = failures[rank]
                self.shutdown()
                host = self._hosts[rank] if rank < len(self._hosts) else "?"
                after = "".join(f"; then rank {r} {_what(failures[r])}" for r in sorted(failures) if r != rank)
                culprit.add_note(f"horovod.ray: rank {rank} of {len(refs)} (on {host}) {_what(culprit)}{after}; "
                                 "every rank was stopped, start() again to run more")
                raise culprit from None
        return ray.get(refs)

    # -- shutdown -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every actor (and remove the placement group this executor made)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        workers, self.workers = self.workers, []
        for worker in workers:
            ray.kill(worker, no_restart=True)
        if self._placement_group is not None and self._own_placement_group:
            remove_placement_group(self._placement_group)
        self._placement_group = None
