"""Spark placement of an elastic job: workers in plain Spark tasks that outlive their workers.

A barrier stage cannot host an elastic job: Spark kills every task of the stage when one fails.
So, as Horovod's own `run_elastic` does, the job is one ordinary (non-barrier) stage of
`max_workers` tasks. Each task is a supervisor that connects to this placement's control server
(a `DriverHub` with the job's secret), announces itself and waits for `WORKER` frames: start
this worker, stop that one. Nothing needs the tasks to gather (no barrier allGather, no
`hub.TaskRendezvous`): the workers meet through the engine's rendezvous rounds and its c10d store,
not through a master address chosen by a task.

Every partition is a host of its own for the engine, named "task<partition>" (Horovod, too,
makes each Spark task "an individual host"): initial worker i runs in partition i, a failed
worker's replacement goes to "its host", i.e. into the same task, local ranks are 0 in every task,
and a task's GPU is its own (`CUDA_VISIBLE_DEVICES`). A partition's name outlives the task
attempt: if an executor is lost, its tasks' workers die with it (reported as killed, with a line
saying why), and a replacement asked for that host waits until Spark runs the partition's next
attempt on another executor. The stage, hence the job, fails only when Spark gives up on a task
(`spark.task.maxFailures`), and otherwise the engine decides: survivors go on while they are at
least `min_workers`.

`discover()` (for the policy's discovery) lists the initial partitions, which Spark keeps
retrying, and the spare partitions (`num_processes` .. `max_workers`-1) whose task is running now.
"""
from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set

from ..errors import LaunchValidationError
from ..hub import DriverHub
from ..protocol import Channel, Kind
from ..spec import LaunchRequest, RankSpec
from .base import JobContext, PlacementCapabilities, added_worker_spec
from .spark import SparkPlacement, _barrier_task
from .spark_plan import NOT_STARTED

#: Exit status reported for the workers of a task whose executor was lost (they were killed with
#: it: the Python worker's death SIGKILLs them).
LOST_WITH_TASK = -int(signal.SIGKILL)


def task_host(partition: int) -> str:
    """The engine's host name for a partition of the elastic stage (one task = one host)."""
    return f"task{partition}"


def _partition_of(host: str) -> Optional[int]:
    suffix = host[len("task"):] if host.startswith("task") else ""
    return int(suffix) if suffix.isdigit() else None


@dataclass
class _Task:
    """The running attempt of one partition."""

    channel: Channel
    executor: str  # the executor's host, for messages
    attempt: int
    workers: Set[int] = field(default_factory=set)  # started here and not reported exited


class SparkElasticPlacement(SparkPlacement):
    """Workers of an elastic job in the tasks of one non-barrier Spark stage (see module doc).

    `max_workers` tasks are submitted (the request's elastic policy's); the cluster must be able
    to run `num_processes` of them at once, which is checked before submitting.
    """

    capabilities = PlacementCapabilities(adds_workers=True)
    job_kind = "job (elastic, one task per worker)"

    def __init__(self, spark: Any = None, required_modules: Sequence[str] = ("torch",)) -> None:
        super().__init__(spark, required_modules)
        self._lock = threading.Lock()
        self._running: Dict[int, _Task] = {}  # partition -> its running attempt
        self._queued: Dict[int, List[RankSpec]] = {}  # partition -> workers waiting for its task
        self._initial = 0
        self._control: Optional[DriverHub] = None
        self._job: Optional[JobContext] = None

    # ---- checks -------------------------------------------------------------------------------
    def validate(self, request: LaunchRequest) -> None:
        """Fail before submitting when fewer than `num_processes` tasks can run at once.

        No barrier, so dynamic allocation is fine; with `use_gpu` each task holds one GPU.
        """
        if request.use_gpu:
            amount = self._conf.get("spark.task.resource.gpu.amount")
            if amount not in ("1", "1.0"):
                raise LaunchValidationError(
                    "An elastic job on Spark runs one worker per task, on the task's GPU: set "
                    f"spark.task.resource.gpu.amount=1 (it is {amount!r}), or pass use_gpu=False.")
        self._per_task = 1
        self._tasks = request.num_processes  # what must run at once: the initial workers
        self._check_slots(request.num_processes, self._conf)
        self._tasks = request.elastic.max_workers if request.elastic else request.num_processes

    def worker_hosts(self, request: LaunchRequest) -> List[str]:
        """Initial worker i runs in partition i (asked before `start`: `discover` lists these
        from now on, so that its first answer removes none of them)."""
        self._initial = request.num_processes
        return [task_host(p) for p in range(request.num_processes)]

    def store_host(self) -> str:
        """The driver address executors use (spark.driver.host), where the job's store listens."""
        return self.hub_host_for_executors(self.hub_bind_host)

    # ---- the job ------------------------------------------------------------------------------
    def start(self, job: JobContext) -> None:
        """Open the control server, queue the initial workers, submit the stage; return at once."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("this SparkElasticPlacement is still running a job; use one per job")
        request = job.request
        self.validate(request)
        self._job = job
        self._initial = request.num_processes
        self._queued = {p: [added_worker_spec(p)] for p in range(request.num_processes)}
        self._control = DriverHub(job.secret, self._on_frame, self._on_close,
                                  bind_host=self.hub_bind_host)
        config = self._task_config(job)
        config["control_address"] = [self.hub_host_for_executors(self._control.address[0]),
                                     self._control.address[1]]
        description = (f"distributor {job.run_id}: elastic job, {request.num_processes} workers "
                       f"in up to {self._tasks} tasks")
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
            worker, _status = body
            with self._lock:
                for task in self._running.values():
                    task.workers.discard(worker)
            job.sink.on_exit(*body)
        elif kind == Kind.SLOT:
            attempt, partition, offer = body[0][1], body[1], body[3]  # body[0]: (stage, attempt)
            with self._lock:
                self._running[partition] = _Task(channel, offer["host"], attempt)
                queued = self._queued.pop(partition, [])
            for spec in queued:
                self._send_start(partition, spec)

    def _on_close(self, channel: Channel) -> None:
        """A task's connection ended: the job is over, or its executor was lost with its workers."""
        with self._lock:
            lost = [(p, t) for p, t in self._running.items() if t.channel is channel]
            for partition, _task in lost:
                del self._running[partition]
        job = self._job
        if job is None:
            return
        for partition, task in lost:
            for worker in sorted(task.workers):  # started there, exit not reported: never will be
                if not self._stop_requested.is_set():
                    job.sink.on_output(worker, "stderr", (
                        f"Spark task {partition} (attempt {task.attempt}) on executor host "
                        f"{task.executor} was lost, and worker {worker} with it"))
                job.sink.on_exit(worker, LOST_WITH_TASK)

    def _send_start(self, partition: int, spec: RankSpec) -> None:
        with self._lock:
            task = self._running.get(partition)
            if task is None:  # no attempt runs now: start it in the next one
                self._queued.setdefault(partition, []).append(spec)
                return
            task.workers.add(spec.rank)
        try:
            task.channel.send(Kind.WORKER, ("start", spec))
        except OSError:
            pass  # the task is gone: `_on_close` reports its workers as lost

    # ---- what the elastic engine asks -----------------------------------------------------------
    def add_worker(self, worker_id: int, host: str) -> None:
        """Start worker `worker_id` in the task of partition `host` ("task<p>"), at once if that
        task runs, else as soon as Spark runs the partition's next attempt."""
        partition = _partition_of(host)
        job = self._job
        assert job is not None, "add_worker is called only after start"
        if partition is None or not 0 <= partition < self._tasks:
            job.sink.on_output(worker_id, "stderr",
                               f"could not start worker {worker_id}: {host!r} is no task of this job")
            job.sink.on_exit(worker_id, NOT_STARTED)
            return
        self._send_start(partition, added_worker_spec(worker_id))

    def stop_worker(self, worker_id: int) -> None:
        """Ask the task running `worker_id` to stop it; its exit is reported as usual (at once
        for a worker still waiting for its task)."""
        with self._lock:
            tasks = [t for t in self._running.values() if worker_id in t.workers]
            waiting = [spec for q in self._queued.values() for spec in q if spec.rank == worker_id]
            for queued in self._queued.values():
                queued[:] = [spec for spec in queued if spec.rank != worker_id]
        self._never_started(waiting)
        for task in tasks:
            try:
                task.channel.send(Kind.WORKER, ("stop", worker_id))
            except OSError:
                pass

    def discover(self) -> Mapping[str, int]:
        """The hosts that may run workers now, one slot each: the initial partitions (Spark
        retries them; a replacement waits for the next attempt) and the spare partitions whose
        task is running."""
        with self._lock:
            running = set(self._running)
        partitions = sorted(set(range(self._initial)) | running)
        return {task_host(p): 1 for p in partitions}

    # ---- the end --------------------------------------------------------------------------------
    def _never_started(self, specs: List[RankSpec]) -> None:
        job = self._job
        for spec in specs:
            if job is not None:
                job.sink.on_exit(spec.rank, -int(signal.SIGTERM))

    def stop(self) -> None:
        """STOP every task (they stop their workers), then cancel the Spark job group."""
        self._stop_requested.set()
        with self._lock:
            waiting = [spec for q in self._queued.values() for spec in q]
            self._queued.clear()
        self._never_started(waiting)
        if self._control is not None:
            self._control.broadcast(Kind.STOP)
        super().stop()

    def close(self) -> None:
        """Drop every task's connection (each stops its workers and returns), then wait for the
        Spark job; tasks still waiting for a slot are cancelled: there is nothing left for them."""
        self._stop_requested.set()
        if self._control is not None:
            self._control.close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            if self._thread.is_alive():
                super().stop()
        super().close()
