"""Spark placement: the ranks run inside one Spark barrier stage on the cluster.

One barrier stage of N tasks (`rdd.barrier().mapPartitions`, no pandas or pyarrow needed). Each
task exchanges its host and a free port with the others through the driver hub (an allGather
without the 1 s polling steps of `BarrierTaskContext.allGather`), takes
its ranks in partition order (`spark_plan.plan_ranks`), and starts them with the job's launcher
under a `Supervisor`, exactly as the local placement does on the driver (`spark_task.run`). The
task's supervisor connects to the driver hub with the job secret and forwards every output line
and exit; the ranks themselves connect to the hub for their payload and send their results.

The Spark job runs in a background thread under its own job group, so the engine can cancel it on
failure, timeout or stop. Before anything is submitted, the request is checked against the
cluster (free barrier slots, dynamic allocation, Spark Connect, GPU amounts), so that a job that
cannot run fails at once with a message saying what to change, instead of Spark retrying for ten
minutes.
"""
from __future__ import annotations

import logging
import re
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import cloudpickle

from ..errors import DistributedRunError, LaunchValidationError
from ..spec import LaunchRequest
from .base import JobContext, Placement, PlacementCapabilities
from .spark_plan import NODE_PER_HOST, NODE_PER_TASK, TASK_ERROR_MARKER, ranks_per_task, task_count

log = logging.getLogger(__name__)

#: How long after the SparkContext started executors may still be registering: a slot shortage
#: seen within this window is re-checked until it ends, later it fails at once.
EXECUTOR_REGISTRATION_SECONDS = 30.0
#: How long `close()` waits for the Spark job to end after it was cancelled.
CANCEL_WAIT_SECONDS = 60.0


def context_conf(sc: Any) -> Any:
    """`sc`'s SparkConf, for reading. `sc.getConf()` builds a copy through Py4J, several round
    trips per entry (~25 ms here, every call); the context's own conf answers a `get` in one."""
    return getattr(sc, "_conf", None) or sc.getConf()


class SparkPlacementError(DistributedRunError):
    """The Spark job hosting the ranks failed for a reason of its own (not a rank's failure).

    `spark_message` keeps Spark's full error text for debugging; the message itself is short.
    """

    def __init__(self, message: str, spark_message: str = "") -> None:
        super().__init__(message)
        self.spark_message = spark_message


def active_spark_context(spark: Any = None) -> Any:
    """The `SparkContext` of `spark` (a SparkSession or SparkContext), or of the active session.

    Raises `LaunchValidationError` when there is none, or when the session is a Spark Connect
    session, which cannot run RDD barrier stages.
    """
    if spark is None:
        try:
            from pyspark import SparkContext
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise LaunchValidationError(
                f"local_mode=False runs the ranks on a Spark cluster, but pyspark cannot be imported "
                f"({exc}): pip install 'horovod-compat[spark]', or use local_mode=True to run every "
                f"rank on this host."
            ) from None
        spark = SparkSession.getActiveSession() or SparkContext._active_spark_context
        if spark is None:
            raise LaunchValidationError(
                "local_mode=False runs the ranks as a Spark barrier stage and needs an active "
                "SparkSession, and there is none. Create one first, e.g. "
                "SparkSession.builder.master('spark://host:7077').getOrCreate(), or use "
                "local_mode=True to run every rank on this host."
            )
    if ".connect." in type(spark).__module__:
        raise LaunchValidationError(
            "The active SparkSession is a Spark Connect session, which cannot run RDD barrier "
            "stages. Use a classic SparkSession (not spark.remote / SPARK_CONNECT_MODE), or "
            "local_mode=True."
        )
    context = getattr(spark, "sparkContext", spark)
    if getattr(context, "_jsc", None) is None:
        raise LaunchValidationError(
            "The SparkSession has been stopped; create a new one before running with "
            "local_mode=False."
        )
    return context


def _barrier_task(config: dict, entry: str = "run") -> Callable[[Iterator[Any]], Iterator[str]]:
    """The function each task runs (`spark_task.<entry>`), pickled by value so that an executor
    without this project still unpickles it and reports what is missing in one clear sentence."""
    marker = TASK_ERROR_MARKER
    required = tuple(config["required_modules"])

    def distributor_barrier_task(rows: Iterator[Any]) -> Iterator[str]:
        import importlib.util
        import sys as task_sys

        hint = ("Install it in the executors' Python environment, or point PYSPARK_PYTHON "
                "(spark.pyspark.python) at a Python that has it.")
        try:
            from distributor.placement import spark_task
        except ImportError as exc:
            raise RuntimeError(
                f"{marker} The executors' Python ({task_sys.executable}) cannot import this "
                f"project's 'distributor' package ({exc}). {hint}"
            ) from None
        missing = [name for name in required if importlib.util.find_spec(name) is None]
        if missing:
            raise RuntimeError(
                f"{marker} The executors' Python ({task_sys.executable}) has no "
                f"{', '.join(repr(m) for m in missing)} module. {hint}"
            )
        return getattr(spark_task, entry)(config, rows)

    return distributor_barrier_task


_PY_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.*)$", re.M)


def explain_spark_failure(exc: BaseException, group: str = "", job: str = "barrier job") -> SparkPlacementError:
    """Turn Spark's error for the `job` running the ranks into one short `SparkPlacementError`."""
    text = str(exc)
    marked = re.search(re.escape(TASK_ERROR_MARKER) + r"\s*(.*)", text)
    if marked:
        return SparkPlacementError(marked.group(1).strip(), text)
    python_errors = _PY_ERROR_LINE.findall(text)
    python_errors = [e for e in python_errors if not e[0].startswith(("org.", "java.", "py4j."))]
    if python_errors:
        name, message = python_errors[-1]
        summary = f"a barrier task raised {name}: {message.strip()}"
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        useful = [line for line in lines if "Job aborted" in line or "cancelled" in line.lower()]
        summary = (useful or lines or [type(exc).__name__])[0]
        summary = summary.split(": ", 1)[1] if summary.startswith(":") else summary
    where = f" (Spark job group {group})" if group else ""
    return SparkPlacementError(
        f"The Spark {job} running the ranks failed{where}: {summary}", text
    )


# Spark's words for a task whose executor process went away (killed, crashed, out of memory, its
# host lost): the barrier stage's abort ("barrier task ResultTask(<stage>, <partition>) finished
# unsuccessfully." then the failure) and the task set's ("Lost task <partition>.<attempt> in stage
# ... (TID ...) (<host> executor <id>): <failure>").
_EXECUTOR_LOST = (
    re.compile(r"barrier task ResultTask\(\d+, (\d+)\) finished unsuccessfully\.\s*"
               r"(ExecutorLostFailure[^\n]*)"),
    re.compile(r"Lost task (\d+)\.\d+ in stage \S+ \(TID \d+\) \([^)]*\): (ExecutorLostFailure[^\n]*)"),
)


def executor_losses(spark_text: str) -> Dict[int, str]:
    """{partition: Spark's ``ExecutorLostFailure ...`` line} for each task that Spark's error text
    says was lost with its executor."""
    lost: Dict[int, str] = {}
    for pattern in _EXECUTOR_LOST:
        for match in pattern.finditer(spark_text):
            lost.setdefault(int(match.group(1)), match.group(2).strip())
    return lost


class SparkPlacement(Placement):
    """Ranks as the tasks of one Spark barrier stage; several ranks per task with multi-GPU tasks.

    `spark` is a SparkSession or SparkContext (default: the active one). `required_modules` are
    checked for in the executors' Python before any rank starts (torch, for TorchDistributor).
    `node_per` says what a torchrun "node" is: each barrier task (default, as PySpark does), or
    each host (see `spark_plan.plan_ranks`).
    """

    capabilities = PlacementCapabilities(loses_tasks=True)

    def __init__(
        self,
        spark: Any = None,
        required_modules: Sequence[str] = ("torch",),
        node_per: str = NODE_PER_TASK,
    ) -> None:
        if node_per not in (NODE_PER_TASK, NODE_PER_HOST):
            raise LaunchValidationError(
                f"node_per must be {NODE_PER_TASK!r} or {NODE_PER_HOST!r}, got {node_per!r}."
            )
        self._node_per = node_per
        self._sc = active_spark_context(spark)
        self._conf = context_conf(self._sc)
        self._required = tuple(required_modules)
        self._per_task = 1
        self._tasks = 0
        self._group = ""
        self._thread: Optional[threading.Thread] = None
        self._done = threading.Event()
        self._stop_requested = threading.Event()
        self._failure: Optional[BaseException] = None
        self._lost_tasks: Dict[int, str] = {}
        self.task_reports: List[dict] = []

    #: How error messages name the Spark job that runs the ranks.
    job_kind = "barrier job"

    # ---- checks -----------------------------------------------------------------------------
    @property
    def hub_bind_host(self) -> str:  # type: ignore[override]
        """Where the driver hub listens: Spark's driver bind address, which executors reach."""
        conf = self._conf
        return conf.get("spark.driver.bindAddress") or conf.get("spark.driver.host") or "127.0.0.1"

    def validate(self, request: LaunchRequest) -> None:
        """Fail before submitting when the cluster cannot run this barrier stage."""
        conf = self._conf
        master = self._sc.master
        local = master == "local" or master.startswith("local[")
        if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true" and not local:
            raise LaunchValidationError(
                "Spark refuses barrier stages while dynamic allocation is on "
                "(spark.dynamicAllocation.enabled=true): the ranks need all their executors at "
                "once. Start the SparkSession with spark.dynamicAllocation.enabled=false and a fixed "
                "spark.executor.instances, or use local_mode=True."
            )
        self._per_task = ranks_per_task(
            request.num_processes, request.use_gpu, conf.get("spark.task.resource.gpu.amount")
        )
        self._tasks = task_count(request.num_processes, self._per_task)
        self._check_slots(request.num_processes, conf)

    def _max_concurrent_tasks(self) -> Optional[int]:
        """Tasks the cluster can run at once with the default resource profile (Spark's own
        barrier check uses the same number); None if the JVM does not tell."""
        try:
            jsc = self._sc._jsc.sc()
            profile = jsc.resourceProfileManager().defaultResourceProfile()
            return int(jsc.maxNumConcurrentTasks(profile))
        except Exception:  # noqa: BLE001 - an unknown count is left to Spark's own check
            return None

    def _executor_count(self) -> Optional[int]:
        try:
            infos = self._sc._jsc.sc().statusTracker().getExecutorInfos()
            return max(0, len(infos) - 1)  # the driver is listed too
        except Exception:  # noqa: BLE001
            return None

    def _check_slots(self, num_processes: int, conf: Any) -> None:
        slots = self._max_concurrent_tasks()
        if slots is None:
            return
        master = self._sc.master
        local = master == "local" or master.startswith("local[")
        started = getattr(self._sc, "startTime", None)
        registration_ends = 0.0  # a local master's slots are its threads: nothing to wait for
        expected = _expected_executors(master, conf)
        executors = self._executor_count()
        if started and not local and not (expected and executors is not None and executors >= expected):
            registration_ends = started / 1000.0 + EXECUTOR_REGISTRATION_SECONDS
        while slots < self._tasks and time.time() < registration_ends:
            time.sleep(0.25)  # a young application: executors may still be registering
            slots = self._max_concurrent_tasks() or 0
        if slots >= self._tasks:
            return
        cpus = conf.get("spark.task.cpus", "1")
        parts = [f"spark.task.cpus={cpus}"]
        executors = self._executor_count()
        if not local and executors is not None:
            parts.insert(0, f"{executors} executor(s) registered")
        gpu = conf.get("spark.task.resource.gpu.amount")
        if gpu:
            parts.append(f"spark.task.resource.gpu.amount={gpu}")
        per_task = f" ({self._per_task} ranks per task)" if self._per_task > 1 else ""
        most = slots * self._per_task
        raise LaunchValidationError(
            f"num_processes={num_processes} needs {self._tasks} Spark barrier tasks running at "
            f"the same time{per_task}, but the cluster (master {master}) has only {slots} task "
            f"slot(s): {', '.join(parts)}. Spark would keep retrying for about 10 minutes before "
            f"failing. Lower num_processes to at most {most}, or give the cluster more executors "
            "or cores (spark.executor.instances / spark.executor.cores, or local[N] with a larger "
            "N)."
        )

    # ---- the job ----------------------------------------------------------------------------
    def start(self, job: JobContext) -> None:
        """Submit the barrier stage from a background thread and return at once."""
        request = job.request
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("this SparkPlacement is still running a job; use one per job")
        if self._tasks == 0:
            self.validate(request)
        config = self._task_config(job)
        description = f"distributor {job.run_id}: {request.num_processes} ranks in {self._tasks} barrier tasks"
        self._submit(job, _barrier_task(config), description)

    def _task_config(self, job: JobContext) -> dict:
        """What every task needs to reach the driver and start its ranks (travels in the closure)."""
        request = job.request
        return {
            "secret": job.secret.hex(),
            "hub_address": [self.hub_host_for_executors(job.hub_address[0]), job.hub_address[1]],
            "run_id": job.run_id,
            "env": dict(request.env),
            "use_gpu": request.use_gpu,
            "ranks_per_task": self._per_task,
            "node_per": self._node_per,
            "launcher": cloudpickle.dumps(job.launcher),
            "driver_python": sys.executable,
            # Spark keeps the task's Python worker for later tasks (its default)
            "reuse_worker": self._conf.get("spark.python.worker.reuse", "true").lower() == "true",
            "required_modules": list(self._required),
        }

    def _submit(self, job: JobContext, task: Callable[[Iterator[Any]], Iterator[str]], description: str) -> None:
        """Run the Spark job of `task` from a background thread under the job's own group."""
        self._done = threading.Event()
        self._stop_requested = threading.Event()
        self._failure = None
        self._lost_tasks = {}
        self.task_reports = []
        self._group = job.run_id
        self._thread = _spark_thread(self._run_spark_job, task, description)
        self._thread.start()

    def _stage(self, task: Callable[[Iterator[Any]], Iterator[str]]) -> Any:
        """The RDD whose collect() runs the tasks: one barrier stage of `self._tasks` tasks."""
        return self._sc.parallelize(range(self._tasks), self._tasks).barrier().mapPartitions(task)

    def hub_host_for_executors(self, bound_host: str) -> str:
        """The driver address the tasks connect to: spark.driver.host, which executors already
        use to reach the driver (the hub may be bound to a wildcard bindAddress)."""
        return self._conf.get("spark.driver.host") or bound_host

    def _run_spark_job(self, task: Callable[[Iterator[Any]], Iterator[str]], description: str) -> None:
        import json

        try:
            self._sc.setJobGroup(self._group, description, interruptOnCancel=True)
            if self._stop_requested.is_set():
                return
            self.task_reports = [json.loads(row) for row in self._stage(task).collect()]
        except BaseException as exc:  # noqa: BLE001 - handed to the engine through failure()
            # what Spark says of lost executors counts even when the engine stopped the job first
            self._lost_tasks = executor_losses(str(exc))
            if not self._stop_requested.is_set():
                self._failure = explain_spark_failure(exc, self._group, self.job_kind)
                log.debug("Spark barrier job failed", exc_info=True)
        finally:
            self._done.set()

    def failure(self) -> Optional[BaseException]:
        """The Spark job's own failure (not a rank's), once it has happened."""
        return self._failure

    def lost_tasks(self) -> Dict[int, str]:
        """The tasks Spark lost with their executor, from the Spark job's error (once it ended)."""
        return dict(self._lost_tasks)

    def finished(self) -> bool:
        """True once the Spark job has ended: no task, hence no rank, can still be running."""
        return self._thread is not None and self._done.is_set()

    def stop(self) -> None:
        """Cancel the job group: Spark kills the tasks, and with them the rank processes.

        The engine has already broadcast STOP through the hub, which the tasks' supervisors and
        the ranks obey at once; the hub's closing drops their connections, which they obey too.
        """
        self._stop_requested.set()
        if self._thread is not None and not self._done.is_set():
            try:
                self._sc.cancelJobGroup(self._group)
            except Exception:  # noqa: BLE001 - the context may already be stopping
                log.debug("cancelJobGroup failed", exc_info=True)

    def close(self) -> None:
        """Wait for the Spark job to end (cancelling it if it still runs), so none outlives run()."""
        if self._thread is None:
            return
        self._thread.join(timeout=5.0)
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while self._thread.is_alive() and time.monotonic() < deadline:
            self.stop()
            self._thread.join(timeout=1.0)
        if self._thread.is_alive():
            log.warning("Spark job group %s did not end %ss after its cancellation",
                        self._group, CANCEL_WAIT_SECONDS)


def _expected_executors(master: str, conf: Any) -> Optional[int]:
    """How many executors the application asked for, when it says: local-cluster[N,...] or
    spark.executor.instances. Once that many have registered there is nothing to wait for."""
    if master.startswith("local-cluster["):
        try:
            return int(master[len("local-cluster["):].split(",", 1)[0])
        except ValueError:
            return None
    instances = conf.get("spark.executor.instances")
    return int(instances) if instances and instances.isdigit() else None


def _spark_thread(target: Callable[..., None], *args: Any) -> threading.Thread:
    """A daemon thread that carries the caller's Spark local properties (pinned thread mode)."""
    try:
        from pyspark import InheritableThread

        thread: threading.Thread = InheritableThread(target, args=args)
    except ImportError:  # pragma: no cover - pyspark is imported whenever this runs
        thread = threading.Thread(target=target, args=args)
    thread.name = "distributor-spark-job"
    thread.daemon = True
    return thread
