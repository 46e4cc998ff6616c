"""Horovod's launchers on this project's engine: ``horovod.run`` (this package is what
``horovod.runner`` resolves to) and the pieces ``horovodrun`` and ``horovod.spark.run`` share:
host lists, knobs, output routing, elastic-argument checks."""
from .api import run

__all__ = ["run"]
