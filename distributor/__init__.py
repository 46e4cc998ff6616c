"""The barrier-mode launch engine: start N rank processes, stream their output, return results.

This package knows nothing of Horovod. Front ends (`TorchDistributor` here, `HorovodRunner` in
`horovod_compat`) describe a job as a `LaunchRequest`; the engine runs it on a placement (this
host, or a Spark barrier stage) and raises one `DistributedRunError` if anything fails.
"""
from .api import run_function, run_script
from .engine import Job, launch
from .errors import (
    DistributedRunError,
    JobTimeoutError,
    LaunchTimeoutError,
    LaunchValidationError,
    PayloadPicklingError,
    RankFailedError,
)
from .spec import CommandTarget, FunctionTarget, LaunchRequest, RankSpec, ScriptTarget
from .torch_distributor import TorchDistributor

__all__ = [
    "CommandTarget",
    "DistributedRunError",
    "FunctionTarget",
    "Job",
    "JobTimeoutError",
    "LaunchRequest",
    "LaunchTimeoutError",
    "LaunchValidationError",
    "PayloadPicklingError",
    "RankFailedError",
    "RankSpec",
    "ScriptTarget",
    "TorchDistributor",
    "launch",
    "run_function",
    "run_script",
]
