"""``horovod.spark.run(fn, ...)``: Horovod 0.28.1's Spark launcher on this project's engine.

One Spark barrier stage of `num_proc` tasks on the active SparkContext (the engine's Spark
placement), one rank per task. Ranks on the same host get local ranks 0..k-1 and local size k,
as Horovod groups tasks by host, so ``torch.cuda.set_device(hvd.local_rank())`` picks distinct
GPUs. ``use_mpi=True`` starts the ranks with one mpirun across the tasks (ranks of a host under
that host's first task, as Horovod's MPI mode does); otherwise each task starts its rank directly
with Horovod's ``HOROVOD_*`` variables (gloo mode).

``run_elastic`` runs Horovod's elastic jobs as one plain stage of `max_num_proc` tasks
(`distributor.placement.spark_elastic`): a failed worker is replaced inside its own task.

Unlike Horovod, a request for more ranks than the cluster's free task slots fails at once (Horovod
waits out its 600 s start timeout), and a failing rank's exception type, message and traceback
reach the driver within seconds, the Spark job group cancelled and no rank left running.
"""
from __future__ import annotations

import logging
import shlex
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from distributor import FunctionTarget, LaunchRequest, LaunchValidationError, launch
from distributor.launchers import MpirunLauncher, PythonLauncher
from distributor.placement import SparkPlacement
from distributor.placement.spark_plan import NODE_PER_HOST

from ..common.liveness import driver_heartbeat_timeout
from ..launch.elastic import check_elastic_args
from ..launch.job import start_timeout_from
from ..launch.knobs import nic_environment
from ..launch.output import RankOutput
from ..run_rank import call_with_slot_env
from ..runner import horovod_environment

log = logging.getLogger("horovod_compat.spark")

#: Horovod's default for start_timeout when HOROVOD_SPARK_START_TIMEOUT is not set (seconds).
DEFAULT_SPARK_START_TIMEOUT = 600.0
#: Horovod's default for elastic_timeout when HOROVOD_ELASTIC_TIMEOUT is not set (seconds).
DEFAULT_ELASTIC_TIMEOUT = 600.0


def _spark_context() -> Any:
    try:
        from pyspark import SparkContext
    except ImportError as exc:
        raise LaunchValidationError(
            f"horovod.spark.run needs pyspark, which cannot be imported ({exc}): pip install "
            "'horovod-compat[spark]', or use horovod.run to run the processes on this host.") from None
    context = SparkContext._active_spark_context
    if context is None or getattr(context, "_jsc", None) is None:
        raise LaunchValidationError(
            "horovod.spark.run could not find an active SparkContext: are you running in a PySpark "
            "session? Create one first, e.g. SparkSession.builder.master('spark://host:7077')"
            ".getOrCreate(), or use horovod.run to run the processes on this host.")
    return context


def _checked_num_proc(num_proc: Any, context: Any, verbose: int) -> int:
    if num_proc is None:
        num_proc = context.defaultParallelism
        if verbose >= 1:
            log.info("Running %d processes (inferred from spark.default.parallelism)...", num_proc)
    elif verbose >= 1:
        log.info("Running %d processes...", num_proc)
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise LaunchValidationError(f"num_proc must be a positive int, got {num_proc!r}")
    return num_proc


def _checked_call(fn: Any, args: Any, kwargs: Any) -> None:
    if not callable(fn):
        raise TypeError(f"horovod.spark.run: fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"horovod.spark.run: args must be a tuple, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"horovod.spark.run: kwargs must be a dict, got {type(kwargs).__name__}")


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] = {},  # noqa: B006 - Horovod's signature; never mutated
    num_proc: Optional[int] = None,
    start_timeout: Optional[float] = None,
    use_mpi: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    extra_mpi_args: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Optional[Sequence[str]] = None,
    prefix_output_with_timestamp: bool = False,
    executable: Optional[str] = None,
) -> List[Any]:
    """Run `fn(*args, **kwargs)` on `num_proc` ranks as Spark tasks; every rank's value in rank
    order.

    `num_proc` defaults to ``sc.defaultParallelism``; `start_timeout` to
    HOROVOD_SPARK_START_TIMEOUT, else 600 s (time for every rank to start). `env` is added to
    every rank's environment (with the driver's HOROVOD_* variables). The ranks' output lines go
    to `stdout`/`stderr` (default: this process's), with a timestamp when
    `prefix_output_with_timestamp`. `nics` pins the ranks' traffic to those interfaces;
    `executable` is the executors' Python for the ranks (default: their PySpark Python).
    `extra_mpi_args` are added to mpirun's command line (``use_mpi=True``).
    """
    _checked_call(fn, args, kwargs)
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    timeout = start_timeout_from(start_timeout, "HOROVOD_SPARK_START_TIMEOUT",
                                 DEFAULT_SPARK_START_TIMEOUT)
    context = _spark_context()
    num_proc = _checked_num_proc(num_proc, context, verbose)
    job_env = {**horovod_environment(), **dict(env or {})}
    nic_list = sorted(set(nics or ()))
    if nic_list:
        job_env.update(nic_environment(nic_list))
    if use_mpi:
        extra = shlex.split(extra_mpi_args) if extra_mpi_args else []
        if nic_list:
            extra += ["--mca", "btl_tcp_if_include", ",".join(nic_list)]
        launcher: Any = MpirunLauncher(**({"python": executable} if executable else {}),
                                       extra_args=extra)
        request_target = (fn, tuple(args), dict(kwargs))
    else:
        launcher = PythonLauncher(**({"python": executable} if executable else {}),
                                  preload=("torch",))
        request_target = (call_with_slot_env, (fn, *args), dict(kwargs))
    request = LaunchRequest(FunctionTarget(*request_target), num_proc, env=job_env,
                            start_timeout=timeout, return_all=True,
                            heartbeat_timeout=driver_heartbeat_timeout(job_env))
    placement = SparkPlacement(context, required_modules=("horovod_compat",), node_per=NODE_PER_HOST)
    if verbose >= 2:
        log.info("horovod.spark.run: %d rank(s) via %s", num_proc,
                 "mpirun across the tasks" if use_mpi else "direct processes")
    with RankOutput(stdout, stderr, timestamps=prefix_output_with_timestamp, size=num_proc) as output:
        return launch(request, placement=placement, launcher=launcher, output=output)


def run_elastic(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] = {},  # noqa: B006 - Horovod's signature; never mutated
    num_proc: Optional[int] = None,
    min_num_proc: Optional[int] = None,
    max_num_proc: Optional[int] = None,
    start_timeout: Optional[float] = None,
    elastic_timeout: Optional[int] = None,
    reset_limit: Optional[int] = None,
    env: Optional[Dict[str, str]] = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Optional[Sequence[str]] = None,
    prefix_output_with_timestamp: bool = False,
    min_np: Optional[int] = None,
    max_np: Optional[int] = None,
) -> List[Any]:
    """Elastic Horovod on Spark: `fn(*args, **kwargs)` on `num_proc` workers (default
    ``sc.defaultParallelism``) that may shrink to `min_num_proc` and grow to `max_num_proc`
    (both default to `num_proc`, as in Horovod); every finished worker's value, in the order of
    their last ranks.

    `fn` uses ``hvd.elastic.run`` and a ``hvd.elastic.State``. The job is one plain Spark stage of
    `max_num_proc` tasks (see `distributor.placement.spark_elastic`): a worker that fails is
    replaced inside its own task while the others keep their state; a task whose executor is
    lost takes its worker with it, and the others go on while at least `min_num_proc` remain
    (Spark runs the task again elsewhere and its replacement joins there). `reset_limit` bounds
    the resets (default: none), `elastic_timeout` (default HOROVOD_ELASTIC_TIMEOUT, else 600 s)
    how long the job waits for enough workers. `min_np`/`max_np` are Horovod's older names.
    """
    import warnings

    from distributor.elastic.policy import ElasticPolicy
    from distributor.placement.spark_elastic import SparkElasticPlacement

    if min_np is not None:
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2)
        min_num_proc = min_np
    if max_np is not None:
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2)
        max_num_proc = max_np
    _checked_call(fn, args, kwargs)
    timeout = start_timeout_from(start_timeout, "HOROVOD_SPARK_START_TIMEOUT",
                                 DEFAULT_SPARK_START_TIMEOUT)
    context = _spark_context()
    num_proc = _checked_num_proc(num_proc, context, verbose)
    check_elastic_args(num_proc, min_num_proc, max_num_proc, reset_limit=reset_limit,
                       elastic_timeout=elastic_timeout)
    settle_timeout = start_timeout_from(elastic_timeout, "HOROVOD_ELASTIC_TIMEOUT",
                                        DEFAULT_ELASTIC_TIMEOUT)
    job_env = {**horovod_environment(), **dict(env or {})}
    nic_list = sorted(set(nics or ()))
    if nic_list:
        job_env.update(nic_environment(nic_list))
    placement = SparkElasticPlacement(context, required_modules=("horovod_compat",))
    most = max_num_proc or num_proc
    policy = ElasticPolicy(
        min_workers=min_num_proc or num_proc, max_workers=most, reset_limit=reset_limit,
        elastic_timeout=settle_timeout,
        # spare tasks (beyond num_proc) join as hosts once Spark runs them
        discovery=placement.discover if most > num_proc else None,
    )
    request = LaunchRequest(FunctionTarget(fn, tuple(args), dict(kwargs)), num_proc, env=job_env,
                            start_timeout=timeout, return_all=True, elastic=policy,
                            heartbeat_timeout=driver_heartbeat_timeout(job_env))
    launcher = PythonLauncher(preload=("torch",))
    with RankOutput(stdout, stderr, timestamps=prefix_output_with_timestamp, size=most) as output:
        return launch(request, placement=placement, launcher=launcher, output=output)
