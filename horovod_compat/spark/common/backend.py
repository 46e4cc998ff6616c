"""``horovod.spark.common.backend``: where the estimators run their training function.

`SparkBackend` runs it on `num_proc` ranks as one Spark barrier stage of the active session
(this project's Spark placement); every line a rank prints reaches `stdout`/`stderr` on the
driver, prefixed with its rank (and a timestamp with `prefix_output_with_timestamp=True`).
"""
from __future__ import annotations

import datetime
import sys
from typing import Any, Dict, List, Optional, Sequence

from ...common.liveness import driver_heartbeat_timeout


class Backend:
    """Runs a function on several processes and returns each process's value."""

    def run(self, fn: Any, args: Sequence[Any] = (), kwargs: Optional[dict] = None,
            env: Optional[Dict[str, str]] = None) -> List[Any]:
        raise NotImplementedError()

    def num_processes(self) -> int:
        raise NotImplementedError()


class SparkBackend(Backend):
    """Horovod's Spark backend: `num_proc` ranks (default: `spark.default.parallelism`) in the
    active SparkSession's cluster.

    `env` is added to every rank's environment; `start_timeout` bounds the time until every rank
    has started (default: HOROVOD_SPARK_START_TIMEOUT or 600 s). `nics`, `verbose` and other
    Horovod arguments about its own launcher are accepted and have no effect here.
    """

    def __init__(self, num_proc: Optional[int] = None, env: Optional[Dict[str, str]] = None,
                 stdout: Any = None, stderr: Any = None, prefix_output_with_timestamp: bool = False,
                 start_timeout: Optional[float] = None, verbose: int = 1, nics: Any = None,
                 **kwargs: Any) -> None:
        from distributor.spec import validate_num_processes

        if num_proc is not None:
            validate_num_processes(num_proc, "num_proc")
        self._num_proc = num_proc
        self._env = dict(env or {})
        self._stdout = stdout
        self._stderr = stderr
        self._timestamps = prefix_output_with_timestamp
        self._start_timeout = start_timeout
        self._verbose = verbose
        self._kwargs = kwargs

    def num_processes(self) -> int:
        if self._num_proc is None:
            from distributor.placement.spark import active_spark_context

            self._num_proc = int(active_spark_context().defaultParallelism)
        return self._num_proc

    def _start_timeout_seconds(self) -> float:
        import os

        if self._start_timeout is not None:
            return float(self._start_timeout)
        return float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", "600"))

    def _write(self, rank: Optional[int], stream: str, line: str) -> None:
        target = (self._stdout or sys.stdout) if stream == "stdout" else (self._stderr or sys.stderr)
        prefix = f"[{rank}]" if rank is not None else "[launcher]"
        if self._timestamps:
            prefix = f"{datetime.datetime.now().strftime('%a %b %d %H:%M:%S %Y')}{prefix}"
        target.write(f"{prefix}<{stream}>:{line}\n")
        target.flush()

    def run(self, fn: Any, args: Sequence[Any] = (), kwargs: Optional[dict] = None,
            env: Optional[Dict[str, str]] = None) -> List[Any]:
        """Run `fn(*args, **kwargs)` on every rank; return the values in rank order."""
        from distributor.api import launch
        from distributor.launchers import PythonLauncher
        from distributor.placement.spark import SparkPlacement
        from distributor.spec import FunctionTarget, LaunchRequest

        job_env = {**self._env, **{k: str(v) for k, v in (env or {}).items()}}
        request = LaunchRequest(
            FunctionTarget(fn, tuple(args), dict(kwargs or {})), self.num_processes(),
            env=job_env, start_timeout=self._start_timeout_seconds(), return_all=True,
            heartbeat_timeout=driver_heartbeat_timeout(job_env),
        )
        # Every estimator's ranks import torch (the Keras ones through the runtime too): in a reused
        # Python worker they fork from a fork server that imported it, and TensorFlow once a Keras
        # fit's ranks did (PythonLauncher), as horovod.spark.run's ranks do.
        return launch(request, SparkPlacement(required_modules=("torch", "pyarrow")),
                      launcher=PythonLauncher(preload=("torch",)), output=self._write)
