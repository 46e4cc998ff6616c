"""The engine's public entry points for Python callers."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .elastic.job import ElasticJob
from .elastic.policy import ElasticPolicy
from .engine import Job
from .launchers import Launcher
from .placement import Placement
from .spec import FunctionTarget, LaunchRequest, MessageHandler, OutputHandler, ScriptTarget


def launch(
    request: LaunchRequest,
    placement: Optional[Placement] = None,
    launcher: Optional[Launcher] = None,
    output: Optional[OutputHandler] = None,
    on_message: Optional[MessageHandler] = None,
) -> Any:
    """Run `request` and return rank 0's value (or every rank's with `return_all`); an elastic
    request (`request.elastic`) runs as an `ElasticJob`."""
    job_type = ElasticJob if request.elastic is not None else Job
    return job_type(request, placement, launcher, output, on_message).run()


def run_function(
    fn: Any,
    *args: Any,
    num_processes: int,
    env: Optional[Mapping[str, str]] = None,
    use_gpu: bool = False,
    return_all: bool = False,
    start_timeout: float = 120.0,
    timeout: Optional[float] = None,
    placement: Optional[Placement] = None,
    launcher: Optional[Launcher] = None,
    output: Optional[OutputHandler] = None,
    elastic: Optional[ElasticPolicy] = None,
    **kwargs: Any,
) -> Any:
    """Run `fn(*args, **kwargs)` on `num_processes` ranks; return rank 0's value.

    With `return_all=True` the values of every rank come back as a list in rank order. Any rank
    failure raises `RankFailedError` after every rank has stopped.

    With `elastic=ElasticPolicy(...)` the job is elastic (`distributor.elastic`): `fn` runs in
    each worker, gets its world from `distributor.worker.join_world()`, and a failed worker is
    replaced while the others go on; the value is the one of the worker with rank 0 in the last
    round (`return_all`: every last-round worker's, in rank order). Exhausting the policy raises
    `ElasticJobFailedError`, listing every attempt.
    """
    request = LaunchRequest(
        FunctionTarget(fn, tuple(args), dict(kwargs)), num_processes, use_gpu=use_gpu,
        env=dict(env or {}), start_timeout=start_timeout, timeout=timeout, return_all=return_all,
        elastic=elastic,
    )
    return launch(request, placement, launcher, output)


def run_script(
    path: str,
    argv: Sequence[str] = (),
    *,
    num_processes: int,
    env: Optional[Mapping[str, str]] = None,
    use_gpu: bool = False,
    start_timeout: float = 120.0,
    timeout: Optional[float] = None,
    placement: Optional[Placement] = None,
    launcher: Optional[Launcher] = None,
    output: Optional[OutputHandler] = None,
) -> None:
    """Run a script written for torchrun on `num_processes` ranks; raise if any rank fails."""
    request = LaunchRequest(
        ScriptTarget(path, tuple(argv)), num_processes, use_gpu=use_gpu, env=dict(env or {}),
        start_timeout=start_timeout, timeout=timeout,
    )
    launch(request, placement, launcher, output)
