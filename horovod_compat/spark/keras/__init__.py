"""``horovod.spark.keras``: `KerasEstimator` and `KerasModel` (loaded on first use, so that
importing this package does not import pyspark.ml or TensorFlow)."""
from typing import Any

__all__ = ["KerasEstimator", "KerasModel"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
