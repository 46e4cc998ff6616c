"""Spark placement of an elastic job: workers in plain Spark tasks that outlive their workers.

A barrier stage cannot host an elastic job: Spark kills every task of the stage when one fails.
So, as Horovod's own `run_elastic` does, the job is one ordinary (non-barrier) stage of
`max_workers` tasks. Each task is a supervisor that connects to this placement's control server
(a `DriverHub` with the job's secret), announces its host and waits; the placement starts the
initial workers in the first `num_processes` tasks that announce themselves, and
`add_worker(worker_id, host)` starts a replacement (or an additional worker) in the task named by
`host`. Nothing needs the tasks to gather: the workers meet through the engine's rendezvous and
its c10d store, not through a master address chosen by a task.

Every task is a host of its own for the engine (Horovod does the same: "each task is an
individual host"), named `<executor host>/task<partition>.<attempt>`, so a worker replaced on
"its host" is replaced inside its task, local ranks are 0 in every task, and a task's GPUs are its
own (`CUDA_VISIBLE_DEVICES`). `discover()` lists the tasks that are connected now, one slot each:
a task whose executor was lost disappears from it (its workers die with it), and the attempt
Spark starts again elsewhere appears as a new host. A worker's failure never fails its task; a
task fails only when its executor is lost, and the stage (hence the job) fails only when Spark
gives up on a task (`spark.task.maxFailures`), when the engine has decided the job cannot go on,
or when the driver stops it.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from ..errors import LaunchValidationError
from ..hub import DriverHub
from ..protocol import Channel, Kind
from ..spec import LaunchRequest, RankSpec
from .base import JobContext
from .spark import SparkPlacement, _barrier_task
from .spark_task import NOT_STARTED

log = logging.getLogger(__name__)


@dataclass
class _Task:
    """One connected task of the elastic stage."""

    host: str  # the engine's name for it: "<executor host>/task<partition>.<attempt>"
    channel: Channel
    partition: int
    workers: List[int]


def task_host_name(executor_host: str, partition: int, attempt: int) -> str:
    """The host name the engine knows a task by (one task = one host, as in Horovod)."""
    return f"{executor_host}/task{partition}.{attempt}"


class SparkElasticPlacement(SparkPlacement):
    """Workers of an elastic job in the tasks of one non-barrier Spark stage (see module doc).

    `max_workers` tasks are submitted (default: the request's elastic policy's); the cluster
    must be able to run `num_processes` of them at once, which is checked before submitting.
    """

    def __init__(self, spark: Any = None, required_modules: Sequence[str] = ("torch",),
                 max_workers: Optional[int] = None) -> None:
        super().__init__(spark, required_modules)
        self._max_workers = max_workers
        self._lock = threading.Lock()
        self._tasks_by_host: Dict[str, _Task] = {}
        self._tasks_by_channel: Dict[Channel, _Task] = {}
        self._initial: List[int] = []
        self._worker_hosts: Dict[int, str] = {}
        self._control: Optional[DriverHub] = None
        self._job: Optional[JobContext] = None

    # ---- checks -------------------------------------------------------------------------------
    def validate(self, request: LaunchRequest) -> None:
        """Fail before submitting when fewer than `num_processes` tasks can run at once.

        Dynamic allocation is fine here (no barrier); GPUs are one per task.
        """
        if request.use_gpu:
            self._per_task = 1
            gpu = self._conf.get("spark.task.resource.gpu.amount")
            if gpu in (None, "") or float(gpu) != 1.0:
                raise LaunchValidationError(
                    "An elastic job on Spark runs one worker per task with one GPU each: set "
                    f"spark.task.resource.gpu.amount=1 (it is {gpu!r}), or pass use_gpu=False.")
        policy = request.elastic
        most = self._max_workers or (policy.max_workers if policy else request.num_processes)
        if most < request.num_processes:
            raise LaunchValidationError(
                f"max_workers={most} is smaller than num_processes={request.num_processes}.")
        self._tasks = request.num_processes  # what must run at once: the initial workers
        self._check_slots(request.num_processes, self._conf)
        self._tasks = most

    # ---- the job ------------------------------------------------------------------------------
    def start(self, job: JobContext) -> None:
        """Open the control server, then submit `max_workers` tasks; return at once."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("this SparkElasticPlacement is still running a job; use one per job")
        self.validate(job.request)
        self._job = job
        self._initial = list(range(job.request.num_processes))
        self._control = DriverHub(job.secret, self._on_frame, self._on_close,
                                  bind_host=self.hub_bind_host)
        config = self._task_config(job)
        config["control_address"] = [self.hub_host_for_executors(self._control.address[0]),
                                     self._control.address[1]]
        config["tasks"] = self._tasks
        description = (f"distributor {job.run_id}: elastic job, {job.request.num_processes} "
                       f"workers in up to {self._tasks} tasks")
        self._submit(job, _barrier_task(config, entry="run_elastic"), description)

    def _stage(self, task: Callable[[Iterator[Any]], Iterator[str]]) -> Any:
        """A plain stage: one task's failure does not take the others down."""
        return self._sc.parallelize(range(self._tasks), self._tasks).mapPartitions(task)

    def _on_frame(self, channel: Channel, kind: Kind, body: Any) -> None:
        job = self._job
        assert job is not None
        if kind == Kind.OUTPUT:
            job.sink.on_output(*body)
        elif kind == Kind.EXITED:
            job.sink.on_exit(*body)
        elif kind == Kind.SLOT:
            (_stage, attempt), partition, _tasks, offer = body
            task = _Task(task_host_name(offer["host"], partition, attempt), channel, partition, [])
            with self._lock:
                self._tasks_by_host[task.host] = task
                self._tasks_by_channel[channel] = task
                worker = self._initial.pop(0) if self._initial else None
            if worker is not None:
                self._start_in(task, worker)

    def _on_close(self, channel: Channel) -> None:
        """A task is gone (its executor was lost, or the job ended): it is no host any more."""
        with self._lock:
            task = self._tasks_by_channel.pop(channel, None)
            if task is not None and self._tasks_by_host.get(task.host) is task:
                del self._tasks_by_host[task.host]

    def _start_in(self, task: _Task, worker_id: int) -> None:
        job = self._job
        assert job is not None
        spec = RankSpec(rank=worker_id, world_size=job.request.num_processes, local_rank=0,
                        local_world_size=1, node_rank=0, num_nodes=1)
        with self._lock:
            task.workers.append(worker_id)
            self._worker_hosts[worker_id] = task.host
        try:
            task.channel.send(Kind.START_WORKER, spec)
        except OSError:  # the task went away just now: the worker failed to start
            job.sink.on_output(worker_id, "stderr",
                               f"could not start worker {worker_id}: Spark task {task.host} is gone")
            job.sink.on_exit(worker_id, NOT_STARTED)

    # ---- what the elastic engine asks -----------------------------------------------------------
    def add_worker(self, worker_id: int, host: str) -> None:
        """Start worker `worker_id` in the task named `host` (a name from `discover()`).

        A task that is gone makes the worker fail at once (an exit status 127 reported for it),
        which the engine handles as any failure to start.
        """
        with self._lock:
            task = self._tasks_by_host.get(host)
        if task is None:
            job = self._job
            assert job is not None
            job.sink.on_output(worker_id, "stderr",
                               f"could not start worker {worker_id}: no Spark task {host} is running")
            job.sink.on_exit(worker_id, NOT_STARTED)
            return
        self._start_in(task, worker_id)

    def discover(self) -> Mapping[str, int]:
        """The hosts that may run workers now: every connected task, one slot each."""
        with self._lock:
            return {host: 1 for host in self._tasks_by_host}

    def worker_host(self, worker_id: int) -> Optional[str]:
        """The host (task) a worker was started in; None before its task has announced itself."""
        with self._lock:
            return self._worker_hosts.get(worker_id)

    # ---- the end --------------------------------------------------------------------------------
    def stop(self) -> None:
        """STOP every task (they stop their workers), then cancel the Spark job group."""
        if self._control is not None:
            self._control.broadcast(Kind.STOP)
        super().stop()

    def close(self) -> None:
        """Drop every task's connection (each stops its workers and returns), then wait for the
        Spark job; tasks that never started (more tasks than free slots) are cancelled."""
        if self._control is not None:
            self._control.close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            if self._thread.is_alive():
                self.stop()  # tasks still pending a slot: nothing for them to do any more
        super().close()
