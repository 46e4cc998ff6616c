"""``horovod.spark``: Horovod's Spark APIs on this project's Spark placement.

`run` and `run_elastic` (from `horovod_compat.spark.runner`) are loaded on first use, so that
importing this package (or its estimator subpackages) does not import pyspark's job machinery.
"""
from typing import Any

__all__ = ["run", "run_elastic"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
