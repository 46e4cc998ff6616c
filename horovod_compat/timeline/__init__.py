"""Horovod timelines for horovod-compat: recording (``writer``), reading, summarising, plotting and
merging (``reader``, ``plot``, ``merge``), and the ``python -m horovod_compat.timeline`` command.

The recorder is attached to the hvd shim by ``horovod_compat.torch.timeline``
(``HOROVOD_TIMELINE``, ``hvd.start_timeline`` / ``hvd.stop_timeline``).  This package itself does
not import torch, so the reading tools run anywhere.
"""
from .writer import TimelineRecorder, TraceFile  # noqa: F401

__all__ = ["TimelineRecorder", "TraceFile"]
