"""Import alias: unchanged Databricks notebooks say `from sparkdl import HorovodRunner`.

This package only re-exports `horovod_compat.runner`; see that module for the behaviour.
"""
from horovod_compat.runner import HorovodRunner

__all__ = ["HorovodRunner"]
