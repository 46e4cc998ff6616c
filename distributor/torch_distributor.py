"""`TorchDistributor` with PySpark's API, on this project's engine.

Differences from `pyspark.ml.torch.distributor.TorchDistributor` a user will notice: a rank's
exception reaches the driver with its type, message and traceback; a failing script raises
instead of returning None; the value returned in local mode is always rank 0's; nothing needs a
SparkSession in local mode; and `.run()` of a small job takes about a second less.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any, Optional, Sequence

from .api import launch
from .errors import LaunchValidationError
from .launchers import PythonLauncher
from .spec import FunctionTarget, LaunchRequest, ScriptTarget, validate_num_processes


class TorchDistributor:
    """Run a PyTorch training function or script on `num_processes` ranks.

    `local_mode=True` runs every rank on the driver host; `local_mode=False` runs them as one
    Spark barrier stage on the cluster. `use_gpu=True` gives each rank one GPU.
    """

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True) -> None:
        self.num_processes = validate_num_processes(num_processes, "num_processes")
        for name, value in (("local_mode", local_mode), ("use_gpu", use_gpu)):
            if not isinstance(value, bool):
                raise LaunchValidationError(f"{name} must be True or False, got {value!r}.")
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.conf = _active_spark_conf()
        self.start_timeout = float(self.conf.get("spark.distributor.startTimeout", 120))
        job_timeout = self.conf.get("spark.distributor.timeout")
        self.timeout: Optional[float] = float(job_timeout) if job_timeout else None

    def run(self, main: Any, *args: Any) -> Optional[Any]:
        """Run `main(*args)` (returns rank 0's value) or the script `main` with `args` (None)."""
        if callable(main):
            target: Any = FunctionTarget(main, tuple(args), {})
        elif isinstance(main, (str, os.PathLike)):
            path = os.fspath(main)
            if not os.path.isfile(path):
                raise LaunchValidationError(
                    f"TorchDistributor.run: {path!r} is neither a callable nor an existing script "
                    f"(current directory {os.getcwd()!r}). Pass a function or a path to a .py file."
                )
            target = ScriptTarget(path, tuple(str(a) for a in args))
        else:
            raise LaunchValidationError(
                f"TorchDistributor.run: main must be a function or a path to a script, got "
                f"{type(main).__name__}."
            )
        request = LaunchRequest(
            target, self.num_processes, use_gpu=self.use_gpu,
            start_timeout=self.start_timeout, timeout=self.timeout,
        )
        return launch(request, self._placement(), self._launcher())

    def train_on_dataframe(self, main: Any, df: Any, *args: Any, batch_size: int = 32,
                           columns: Optional[Sequence[str]] = None, shuffle: bool = True,
                           seed: int = 0, path: Optional[str] = None, **kwargs: Any) -> Optional[Any]:
        """Run `main(shard, *args, **kwargs)` on every rank, where `shard` is the rank's share of
        `df` as a `DataFrameShard` (`shard.batches(epoch)` yields dicts of tensors by column).

        The DataFrame's `columns` (default: all; numeric, arrays or pyspark.ml vectors) are
        written as Parquet under `path` (default: a temporary directory on the driver, removed
        afterwards; on a cluster of several hosts give a directory every executor can read) and
        every rank streams its own rows. `num_processes` need not equal the DataFrame's
        partitions. Returns rank 0's value.
        """
        return self._run_on_dataframe(main, df, args, kwargs, True, batch_size, columns, shuffle,
                                      seed, path)

    def _train_on_dataframe(self, train_function: Any, spark_dataframe: Any, *args: Any,
                            **kwargs: Any) -> Optional[Any]:
        """PySpark's name: run `train_function(*args, **kwargs)` on every rank; inside it,
        `distributor.dataframe.current_shard()` is the rank's share of `spark_dataframe` (batches
        of 32 rows of every column)."""
        return self._run_on_dataframe(train_function, spark_dataframe, args, kwargs, False, 32,
                                      None, True, 0, None)

    def _run_on_dataframe(self, main: Any, df: Any, args: tuple, kwargs: dict, pass_shard: bool,
                          batch_size: int, columns: Optional[Sequence[str]], shuffle: bool,
                          seed: int, path: Optional[str]) -> Optional[Any]:
        from .dataframe import ShardSpec, prepare_dataframe, run_on_shard

        if not callable(main):
            raise LaunchValidationError(
                f"train_on_dataframe: main must be a function, got {type(main).__name__}."
            )
        validate_num_processes(batch_size, "batch_size")
        scratch = None
        if path is None:
            scratch = path = tempfile.mkdtemp(prefix="distributor-dataframe-")
        try:
            infos, _ = prepare_dataframe(df, os.path.join(path, "data"), self.num_processes, columns)
            spec = ShardSpec(os.path.join(path, "data"), tuple(infos), batch_size, shuffle, seed)
            request = LaunchRequest(
                FunctionTarget(run_on_shard, (main, spec, pass_shard, *args), dict(kwargs)),
                self.num_processes, use_gpu=self.use_gpu, start_timeout=self.start_timeout,
                timeout=self.timeout,
            )
            return launch(request, self._placement(), self._launcher())
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def _placement(self) -> Any:
        """This host for `local_mode=True`; one barrier stage of the active SparkSession otherwise."""
        if self.local_mode:
            return None  # the engine's default: this host
        from .placement.spark import SparkPlacement

        return SparkPlacement(required_modules=("torch",))

    @staticmethod
    def _launcher() -> PythonLauncher:
        """Direct rank processes; every rank imports torch, so a reused Spark Python worker keeps
        it imported in a fork server for the next job (see `PythonLauncher`)."""
        return PythonLauncher(preload=("torch",))


def _active_spark_conf() -> dict:
    """The active SparkSession's conf, if one exists; pyspark is not imported for it."""
    if "pyspark" not in sys.modules:
        return {}
    try:
        from pyspark.sql import SparkSession

        from .placement.spark import context_conf

        session = SparkSession.getActiveSession()
        return dict(context_conf(session.sparkContext).getAll()) if session is not None else {}
    except Exception:  # noqa: BLE001 - a broken session must not stop local training
        return {}
