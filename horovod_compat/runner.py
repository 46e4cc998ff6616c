"""`HorovodRunner`: Databricks' `sparkdl.HorovodRunner` API on this project's engine.

`HorovodRunner(np).run(main, **kwargs)` runs `main(**kwargs)` on |np| ranks and returns rank 0's
value. `np < 0` runs -np ranks on the driver only (no Spark job), started by `mpirun`; `np > 0`
runs np ranks as one Spark barrier stage on the active SparkSession, with one mpirun across the
tasks; the ranks of one host get local ranks 0..k-1, as Horovod groups them. Inside every rank
`import horovod.torch as hvd` resolves to this project, `hvd.init()` finds rank and size (from
MPI, or from the torchrun variables the engine sets), and `HOROVOD_*` variables set on the driver
(notably `HOROVOD_TIMELINE`) are forwarded.

With `np < 0` every rank's output reaches the driver, as Databricks sends it to the notebook cell;
with `np > 0` `driver_log_verbosity` decides.

`np == 0` was Databricks' deprecated "use every task slot" mode; here it is an error that says
which value to pass instead, because silently grabbing the whole cluster surprises more users
than it helps.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Dict, Optional, Tuple

from distributor import FunctionTarget, LaunchRequest, launch
from distributor.launchers import MpirunLauncher
from distributor.worker import in_rank, send_to_driver

from .common.liveness import driver_heartbeat_timeout

_VERBOSITIES = ("all", "log_callback_only")


class HorovodRunner:
    """Run a Horovod training function on |np| ranks and return rank 0's value.

    `np < 0`: -np ranks on the driver only (no Spark job), started by `mpirun` (the `mpi` extra).
    `np > 0`: np ranks as one Spark barrier stage on the active SparkSession (the `spark` extra),
    one mpirun across the tasks. `np == 0` (Databricks' deprecated "every task slot") is an error
    that says which value to pass.

    `driver_log_verbosity` applies to `np > 0`, as on Databricks: `"log_callback_only"` (the
    default) shows on the driver only what ranks send with `sparkdl.horovod.log_to_driver`, and
    when the job ends says how many lines the ranks printed that were not shown; `"all"` streams
    every rank's output. With `np < 0` every rank's output is shown, whatever the verbosity
    (Databricks sends it to the notebook cell). A failure always shows the failing rank's whole
    traceback.
    """

    def __init__(self, np: int, driver_log_verbosity: str = "log_callback_only") -> None:
        if isinstance(np, bool) or not isinstance(np, int):
            raise TypeError(f"HorovodRunner: np must be an int, got {np!r} ({type(np).__name__}).")
        if np == 0:
            raise ValueError(
                "HorovodRunner(np=0) is not supported: it was Databricks' deprecated 'use all task "
                "slots' mode. Pass np=N (N > 0) to run N ranks as Spark tasks, or np=-N to run N "
                "ranks on the driver only."
            )
        if driver_log_verbosity not in _VERBOSITIES:
            raise ValueError(
                f"HorovodRunner: driver_log_verbosity must be one of {_VERBOSITIES}, got "
                f"{driver_log_verbosity!r}."
            )
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity

    @property
    def local_mode(self) -> bool:
        return self.num_processor < 0

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run `main(**kwargs)` on every rank and return rank 0's return value."""
        if not callable(main):
            raise TypeError(f"HorovodRunner.run: main must be a function, got {type(main).__name__}.")
        _check_kwargs(main, kwargs)
        env = horovod_environment()
        request = LaunchRequest(
            FunctionTarget(main, (), dict(kwargs)), abs(self.num_processor),
            env=env, start_timeout=_start_timeout(), heartbeat_timeout=driver_heartbeat_timeout(env),
        )
        quiet = None if self.local_mode or self.driver_log_verbosity == "all" else _Quiet()
        placement, launcher = self._placement_and_launcher()
        result = launch(request, placement=placement, launcher=launcher, output=quiet,
                        on_message=_print_log_message)
        if quiet is not None and quiet.hidden:
            print(f"HorovodRunner: the ranks printed {quiet.hidden} line(s) that were not shown: "
                  'driver_log_verbosity="log_callback_only" (the default) shows only what they '
                  "send with sparkdl.horovod.log_to_driver; HorovodRunner(np=..., "
                  'driver_log_verbosity="all") shows every line.', flush=True)
        return result

    def _placement_and_launcher(self) -> Tuple[Any, Any]:
        """Driver only: mpirun on this host. Cluster: one mpirun across the Spark tasks."""
        if self.local_mode:
            return None, MpirunLauncher()  # None: the engine's default placement, this host
        from distributor.placement import SparkPlacement
        from distributor.placement.spark_plan import NODE_PER_HOST

        # ranks of one host are its local ranks 0..k-1 (torch.cuda.set_device(hvd.local_rank())
        # in Databricks' notebooks), as Horovod groups them, not one node per Spark task
        placement = SparkPlacement(required_modules=("torch", "horovod_compat"), node_per=NODE_PER_HOST)
        return placement, MpirunLauncher()


def log_to_driver(message: Any) -> None:
    """Show `message` in the driver's output; the only rank output shown by default."""
    if in_rank():
        send_to_driver(message)
    else:
        print(message, flush=True)


def horovod_environment() -> Dict[str, str]:
    """Driver variables every rank must see, as `mpirun -x` would forward them."""
    return {k: v for k, v in os.environ.items() if k.startswith(("HOROVOD_", "NCCL_", "OMPI_MCA_"))}


def _start_timeout() -> float:
    return float(os.environ.get("HOROVOD_START_TIMEOUT", "120"))


class _Quiet:
    """Output handler of `log_callback_only`: lines are counted, not shown (the engine keeps them
    for the error report of a failed rank)."""

    def __init__(self) -> None:
        self.hidden = 0

    def __call__(self, rank: Optional[int], stream: str, line: str) -> None:
        self.hidden += 1


def _print_log_message(rank: int, message: Any) -> None:
    print(message if isinstance(message, str) else repr(message), flush=True)


def _check_kwargs(main: Callable[..., Any], kwargs: Dict[str, Any]) -> None:
    try:
        signature = inspect.signature(main)
    except (TypeError, ValueError):
        return  # builtins and some C callables have no signature to check
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise TypeError(
            f"HorovodRunner.run: the keyword arguments {sorted(kwargs)} do not fit "
            f"{getattr(main, '__name__', 'main')}{signature}: {exc}. Pass exactly the parameters "
            "the training function takes, by name."
        ) from None


__all__ = ["HorovodRunner", "log_to_driver"]
