"""The barrier-mode launch engine: start N rank processes, stream their output, return results.

This package knows nothing of Horovod. Front ends (`TorchDistributor` here, `HorovodRunner` in
`horovod_compat`) describe a job as a `LaunchRequest`; the engine runs it on a placement (this
host, or a Spark barrier stage) and raises one `DistributedRunError` if anything fails.

The names below are imported on first use: a rank process (`python -m distributor.rank_entry`)
and the helpers started per job import this package too, and need none of the driver's side.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

#: Public name -> the module that defines it.
_EXPORTS = {
    "run_function": ".api",
    "run_script": ".api",
    "Job": ".engine",
    "launch": ".api",
    "DistributedRunError": ".errors",
    "ElasticJobFailedError": ".errors",
    "ElasticTimeoutError": ".errors",
    "ElasticPolicy": ".elastic.policy",
    "JobTimeoutError": ".errors",
    "LaunchTimeoutError": ".errors",
    "LaunchValidationError": ".errors",
    "PayloadPicklingError": ".errors",
    "RankFailedError": ".errors",
    "CommandTarget": ".spec",
    "FunctionTarget": ".spec",
    "LaunchRequest": ".spec",
    "RankSpec": ".spec",
    "ScriptTarget": ".spec",
    "TorchDistributor": ".torch_distributor",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # what static tools see
    from .api import launch, run_function, run_script
    from .elastic.policy import ElasticPolicy
    from .engine import Job
    from .errors import (
        DistributedRunError,
        ElasticJobFailedError,
        ElasticTimeoutError,
        JobTimeoutError,
        LaunchTimeoutError,
        LaunchValidationError,
        PayloadPicklingError,
        RankFailedError,
    )
    from .spec import CommandTarget, FunctionTarget, LaunchRequest, RankSpec, ScriptTarget
    from .torch_distributor import TorchDistributor
