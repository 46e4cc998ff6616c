"""``horovod.spark.lightning``: `TorchEstimator` for LightningModules (Lightning 2, whether they
subclass ``pytorch_lightning.LightningModule`` or ``lightning.pytorch.LightningModule``) and its
`TorchModel`; loaded on first use."""
from typing import Any

__all__ = ["TorchEstimator", "TorchModel"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
