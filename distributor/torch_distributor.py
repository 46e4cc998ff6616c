"""`TorchDistributor` with PySpark's API, on this project's engine.

A drop-in for `pyspark.ml.torch.distributor.TorchDistributor` (PySpark 4.x): the same constructor
(`num_processes`, `local_mode`, `use_gpu`, `_ssl_conf`), the same checks at construction, in the
same order, with the same exception types (ours are also `LaunchValidationError`) and messages
that start with PySpark's words and go on to say what to change, and the same `run(train_object,
*args, **kwargs)`. Like PySpark, `use_gpu=True` (the default) takes its GPUs from Spark's resource
settings: `spark.driver.resource.gpu.*` in local mode, `spark.task.resource.gpu.amount` otherwise.

Differences from PySpark's a user will notice: a rank's exception reaches the driver with its
type, message and traceback; a failing script raises instead of returning None; the value
returned in local mode is always rank 0's; nothing needs a SparkSession in local mode (with
`use_gpu=True` and no session, the host's visible GPUs are the driver's); `.run()` of a small job
takes about a second less; and `max_restarts=N` (keyword-only, not in PySpark) runs every rank
again after a failure, as torchrun does.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

from .api import launch
from .errors import LaunchTypeError, LaunchValidationError
from .launchers import PythonLauncher
from .placement.local import LocalPlacement, visible_gpus
from .spec import (FunctionTarget, LaunchRequest, ScriptTarget, validate_max_restarts,
                   validate_num_processes)

logger = logging.getLogger(__name__)

#: PySpark's Spark conf that lets TorchDistributor run on a cluster with TLS on (`_ssl_conf`).
TORCH_SSL_CONF = "pytorch.spark.distributor.ignoreSsl"
TASK_GPU_AMOUNT = "spark.task.resource.gpu.amount"
DRIVER_GPU_AMOUNT = "spark.driver.resource.gpu.amount"
_CPU_HINT = "or pass use_gpu=False to train on the CPU with the gloo backend."


class TorchDistributor:
    """Run a PyTorch training function or script on `num_processes` ranks.

    `local_mode=True` runs every rank on the driver host; `local_mode=False` runs them as one
    Spark barrier stage on the cluster. `use_gpu=True` gives each rank one GPU: in local mode
    one of the driver's GPUs from `spark.driver.resource.gpu.*` (the host's visible GPUs when no
    SparkSession is active); otherwise the GPUs Spark assigns each task
    (`spark.task.resource.gpu.amount`). As in PySpark, a local-mode `num_processes` above the
    driver's GPU count is lowered to it, with a warning.

    `max_restarts=N` (this project's addition; PySpark has no such argument) is torchrun's
    ``--max-restarts``: when a rank fails, every rank is stopped and the whole job runs again from
    the start (on Spark: in a new barrier stage), up to N times. Each rank sees
    TORCHELASTIC_RESTART_COUNT; resuming from a checkpoint is the training code's business.
    """

    _TORCH_SSL_CONF = TORCH_SSL_CONF

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True,
                 _ssl_conf: str = TORCH_SSL_CONF, *, max_restarts: int = 0) -> None:
        self.local_mode = _flag("local_mode", local_mode)
        self.use_gpu = _flag("use_gpu", use_gpu)
        if not isinstance(_ssl_conf, str):
            raise LaunchTypeError(
                f"_ssl_conf must be the name of a Spark conf (PySpark's 4th argument), got "
                f"{_ssl_conf!r}; max_restarts is keyword-only: pass max_restarts={_ssl_conf!r}.")
        self.ssl_conf = _ssl_conf
        self.max_restarts = validate_max_restarts(max_restarts)
        self.spark = _active_session(import_pyspark=not self.local_mode)
        if self.spark is None and not self.local_mode:
            raise LaunchValidationError(
                "No active or default Spark session found: local_mode=False runs the ranks as a "
                "Spark barrier stage and needs an active SparkSession. Create one first, e.g. "
                "SparkSession.builder.master('spark://host:7077').getOrCreate(), or use "
                "local_mode=True to run every rank on this host.")
        # PySpark's order: the GPU settings first (they may lower num_processes), then the count
        self.num_processes: Any = num_processes
        self.num_tasks = self._get_num_tasks()
        self.num_processes = validate_num_processes(self.num_processes, "num_processes")
        self.conf = _context_conf(self.spark)
        self.start_timeout = float(self.conf.get("spark.distributor.startTimeout", 120))
        job_timeout = self.conf.get("spark.distributor.timeout")
        self.timeout: Optional[float] = float(job_timeout) if job_timeout else None

    def _get_num_tasks(self) -> Any:
        """PySpark's `_get_num_tasks`: check the GPU settings `use_gpu` needs, lower
        `num_processes` to the driver's GPU count in local mode, and return the number of Spark
        tasks. `num_processes` is not validated yet (the caller does it next, as PySpark does)."""
        n = self.num_processes
        whole = isinstance(n, int) and not isinstance(n, bool)
        if not self.use_gpu:
            return n
        if not self.local_mode:
            per_task = _task_gpu_amount(_get_conf(self.spark, TASK_GPU_AMOUNT, "0"))
            if per_task > 1 and whole and n % per_task:
                low = per_task * max(1, n // per_task)
                raise LaunchValidationError(
                    f"TorchDistributor 'num_processes' value ({n}) must be a multiple of "
                    f"'{TASK_GPU_AMOUNT}' ({per_task}) value: num_processes={n} is not a multiple "
                    f"of {TASK_GPU_AMOUNT}={per_task}, and each Spark task holds {per_task} GPUs "
                    f"and runs one rank per GPU. Use num_processes={low} or {low + per_task}, or "
                    f"set {TASK_GPU_AMOUNT}=1.")
            return n // per_task if whole and per_task > 1 else n
        available = self._driver_gpu_count()
        if whole and n > available:
            logger.warning(
                "'num_processes' cannot be set to a value greater than the number of available "
                "GPUs on the driver, which is %d. 'num_processes' was reset to be equal to the "
                "number of available GPUs.", available)
            self.num_processes = available
        return self.num_processes

    def _driver_gpu_count(self) -> int:
        """How many GPUs local-mode ranks may use: `spark.driver.resource.gpu.amount` of the
        active SparkSession (which must have found GPUs), or the host's visible GPUs without one."""
        if self.spark is None:
            gpus = visible_gpus()
            if not gpus:
                raise LaunchValidationError(
                    "GPUs were unable to be found on the driver: use_gpu=True (the default) but "
                    "no SparkSession is active to assign GPUs and no GPU is visible on this host "
                    f"(nvidia-smi finds none). Start a SparkSession with {DRIVER_GPU_AMOUNT}, "
                    + _CPU_HINT)
            return len(gpus)
        if "gpu" not in _driver_resources(self.spark):
            raise LaunchValidationError(
                "GPUs were unable to be found on the driver: use_gpu=True (the default) with "
                "local_mode=True runs the ranks on the GPUs Spark assigned to the driver, and the "
                f"SparkSession has none. Start it with {DRIVER_GPU_AMOUNT}=N and "
                "spark.driver.resource.gpu.discoveryScript (e.g. Spark's "
                "examples/src/main/scripts/getGpusResources.sh), " + _CPU_HINT)
        raw = _get_conf(self.spark, DRIVER_GPU_AMOUNT, "0")
        try:
            available = int(raw)
        except ValueError:
            raise LaunchValidationError(
                f"{DRIVER_GPU_AMOUNT}={raw!r} is not a whole number of GPUs.") from None
        if available <= 0:
            raise LaunchValidationError(
                "GPU resources were not configured properly on the driver: the SparkSession found "
                f"GPUs on the driver but {DRIVER_GPU_AMOUNT} is {raw!r}. Set it to the number of "
                "GPUs the ranks may use, " + _CPU_HINT)
        return available

    def run(self, train_object: Any, *args: Any, **kwargs: Any) -> Optional[Any]:
        """Run `train_object(*args, **kwargs)` on every rank and return rank 0's value, or the
        script at path `train_object` with `args` as its command-line arguments (as strings) and
        return None. As in PySpark, a script takes no keyword arguments."""
        if callable(train_object):
            target: Any = FunctionTarget(train_object, tuple(args), dict(kwargs))
        elif isinstance(train_object, (str, os.PathLike)):
            path = os.fspath(train_object)
            if kwargs:
                raise LaunchValidationError(
                    "Running pytorch file does not support key-word type arguments: a script's "
                    f"arguments are command-line strings. Pass {sorted(kwargs)} as args instead, "
                    "e.g. run(path, '--tol', '1e-3'), and read them with argparse.")
            if not os.path.isfile(path):
                raise LaunchValidationError(
                    f"TorchDistributor.run: {path!r} is neither a callable nor an existing script "
                    f"(current directory {os.getcwd()!r}). Pass a function or a path to a .py file."
                )
            target = ScriptTarget(path, tuple(str(a) for a in args))
        else:
            raise LaunchValidationError(
                f"TorchDistributor.run: main must be a function or a path to a script, got "
                f"{type(train_object).__name__}."
            )
        request = LaunchRequest(
            target, self.num_processes, use_gpu=self.use_gpu,
            start_timeout=self.start_timeout, timeout=self.timeout, max_restarts=self.max_restarts,
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
                timeout=self.timeout, max_restarts=self.max_restarts,
            )
            return launch(request, self._placement(), self._launcher())
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def _placement(self) -> Any:
        """This host for `local_mode=True` (on the driver's Spark GPUs with `use_gpu`); one
        barrier stage of the SparkSession otherwise."""
        if self.local_mode:
            gpus = self._driver_gpus() if self.use_gpu else None
            # without Spark's GPUs (no session, Spark Connect): the host's, the engine's default
            return None if gpus is None else _DriverGpuPlacement(gpus)
        from .placement.spark import SparkPlacement

        self._check_encryption()
        return SparkPlacement(self.spark, required_modules=("torch",))

    def _driver_gpus(self) -> Optional[List[str]]:
        """PySpark's `_get_gpus_owned` of the session: the driver's GPU addresses, as
        CUDA_VISIBLE_DEVICES ids (mapped through it when it is set); None without a classic
        session that has them."""
        if self.spark is None or _is_connect(self.spark):
            return None  # PySpark too leaves the GPUs alone under Spark Connect
        gpu = _driver_resources(self.spark).get("gpu")
        if gpu is None:
            return None
        addresses = list(gpu.addresses)
        if any(not re.fullmatch(r"[1-9][0-9]*|0", a) for a in addresses):
            raise LaunchValidationError(
                f"Found GPU addresses {addresses} which are not all in the correct format for "
                "CUDA_VISIBLE_DEVICES, which requires integers with no zero padding. Check the "
                "output of spark.driver.resource.gpu.discoveryScript.")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return addresses
        ids = visible.split(",")
        try:
            return [ids[int(a)] for a in addresses]
        except IndexError:
            raise LaunchValidationError(
                f"The driver's Spark GPU addresses {addresses} do not all index "
                f"CUDA_VISIBLE_DEVICES={visible!r}.") from None

    def _check_encryption(self) -> None:
        """PySpark's `_check_encryption`: the ranks' traffic (the pickled function, its results,
        torch.distributed's) is not encrypted, so a cluster with `spark.ssl.enabled` must opt in
        with `self.ssl_conf` (default `pytorch.spark.distributor.ignoreSsl`) set to true."""
        if self.spark is None or not _get_conf_boolean(self.spark, "spark.ssl.enabled"):
            return
        if _get_conf_boolean(self.spark, self.ssl_conf):
            logger.warning(
                "This cluster has TLS encryption enabled; however, TorchDistributor does not "
                "support data encryption in transit. The Spark configuration '%s' has been set "
                "to 'true' to override this configuration and use TorchDistributor anyway. "
                "Please note this will cause model parameters and possibly training data to be "
                "sent between nodes unencrypted.", self.ssl_conf)
            return
        raise LaunchValidationError(
            "This cluster has TLS encryption enabled; however, TorchDistributor does not support "
            "data encryption in transit. To override this configuration and use TorchDistributor "
            f"anyway, you may set '{self.ssl_conf}' to 'true' in the Spark configuration. Please "
            "note this will cause model parameters and possibly training data to be sent between "
            "nodes unencrypted. Or use local_mode=True, whose ranks talk only over this host.")

    @staticmethod
    def _launcher() -> PythonLauncher:
        """Direct rank processes; every rank imports torch, so a reused Spark Python worker keeps
        it imported in a fork server for the next job (see `PythonLauncher`)."""
        return PythonLauncher(preload=("torch",))


class _DriverGpuPlacement(LocalPlacement):
    """This host, with the GPUs Spark assigned to the driver instead of every visible one."""

    def __init__(self, gpus: Sequence[str]) -> None:
        super().__init__()
        self._driver_gpu_ids = list(gpus)

    def validate(self, request: LaunchRequest) -> None:
        if request.use_gpu and len(self._driver_gpu_ids) < request.num_processes:
            raise LaunchValidationError(
                f"use_gpu=True needs one GPU per rank: num_processes={request.num_processes} but "
                f"Spark assigned the driver only {len(self._driver_gpu_ids)} GPU(s) "
                f"({','.join(self._driver_gpu_ids)}). Raise {DRIVER_GPU_AMOUNT}, lower "
                "num_processes, or pass use_gpu=False.")
        self._gpus = self._driver_gpu_ids[:request.num_processes] if request.use_gpu else []


def _flag(name: str, value: Any) -> bool:
    """`local_mode` / `use_gpu`: True or False (also 1 / 0 and numpy booleans, which PySpark's
    truth test takes the same way); a string or None is refused, since "False" would be true."""
    if isinstance(value, bool):
        return value
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")
    if (isinstance(value, int) and value in (0, 1)) or numpy_bool:
        return bool(value)
    raise LaunchTypeError(f"{name} must be True or False, got {value!r}.")


def _task_gpu_amount(raw: str) -> int:
    """Ranks per task from `spark.task.resource.gpu.amount` (PySpark's checks, plus fractions of
    a GPU, which PySpark cannot parse: one rank per task)."""
    try:
        amount = float(raw)
    except ValueError:
        raise LaunchValidationError(f"{TASK_GPU_AMOUNT}={raw!r} is not a number.") from None
    if amount <= 0:
        raise LaunchValidationError(
            f"'{TASK_GPU_AMOUNT}' was unset, so gpu usage is unavailable: use_gpu=True (the "
            f"default) but {TASK_GPU_AMOUNT} is not set, so Spark gives the tasks no GPU. Set "
            f"{TASK_GPU_AMOUNT} (and spark.executor.resource.gpu.amount with a discovery script) "
            "when creating the SparkSession, " + _CPU_HINT)
    if amount > 1 and not amount.is_integer():
        raise LaunchValidationError(
            f"{TASK_GPU_AMOUNT}={raw}: amounts above 1 must be whole GPUs (each rank gets one). "
            "Use an integer.")
    return max(1, int(amount))


def _active_session(import_pyspark: bool) -> Any:
    """PySpark's `SparkSession.active()` (the thread's active session, else the default one), or
    None; pyspark is imported only when `import_pyspark` (it must exist for local_mode=False)."""
    if "pyspark" not in sys.modules and not import_pyspark:
        return None
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise LaunchValidationError(
            f"local_mode=False runs the ranks on a Spark cluster, but pyspark cannot be imported "
            f"({exc}): pip install 'horovod-compat[spark]', or use local_mode=True to run every "
            f"rank on this host.") from None
    try:
        active = getattr(SparkSession, "active", None)
        return active() if active is not None else SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001 - PySpark's "no active or default session"
        return None


def _is_connect(session: Any) -> bool:
    return ".connect." in type(session).__module__


def _get_conf(session: Any, key: str, default: str) -> str:
    """The session's runtime conf, as PySpark reads it (it includes the SparkContext's)."""
    value = session.conf.get(key, default)
    return default if value is None else value


def _get_conf_boolean(session: Any, key: str) -> bool:
    return _get_conf(session, key, "false").strip().lower() == "true"


def _driver_resources(session: Any) -> Dict[str, Any]:
    """The driver's Spark resources (name -> ResourceInformation), as PySpark gets them."""
    try:
        return session.sparkContext.resources
    except Exception:  # noqa: BLE001 - Spark Connect: the server's, as PySpark asks for them
        try:
            return session._client._resources()
        except Exception:  # noqa: BLE001
            return {}


def _context_conf(session: Any) -> dict:
    """The session's SparkContext conf, if there is one."""
    if session is None:
        return {}
    try:
        from .placement.spark import context_conf

        return dict(context_conf(session.sparkContext).getAll())
    except Exception:  # noqa: BLE001 - a broken session must not stop local training
        return {}
