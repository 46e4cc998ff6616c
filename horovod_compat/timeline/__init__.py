"""Horovod timelines for horovod-compat: recording (``writer``), reading, summarising, plotting and
merging (``reader``, ``plot``, ``merge``), and the ``python -m horovod_compat.timeline`` command.

Recording (attached to the hvd shim by ``horovod_compat.common.timeline``)::

    HOROVOD_TIMELINE=/path/tl.json            rank 0 records from hvd.init() (Horovod's behaviour)
    HOROVOD_TIMELINE=/path/tl.{rank}.json     every rank records its own file
    HOROVOD_TIMELINE=DYNAMIC                  hvd.start_timeline(path, mark_cycles) / hvd.stop_timeline()
    HOROVOD_TIMELINE_MARK_CYCLES=1            CYCLE_START instants (one per burst of collectives)
    HOROVOD_TIMELINE_MAX_BYTES=64M            stop opening new spans past this size
    HOROVOD_TIMELINE_STEPS=100:110            record only cycles 100..109
    HOROVOD_TIMELINE_FLUSH_MS=100             how often the writer thread writes (file valid after each)

Reading::

    python -m horovod_compat.timeline summarize tl.json [--internal] [--plot tl.png]
    python -m horovod_compat.timeline plot tl.json [-o tl.png] [--all | --from MS --to MS | --steps A:B]
    python -m horovod_compat.timeline merge tl.0.json tl.1.json -o merged.json

The plot shows the steady state by default (from the end of training step 1; ``plot`` says how it
is chosen), one row per tensor as Horovod names it, step boundaries from the ``STEP`` marks that
``DistributedOptimizer`` writes; horovod-compat's internal bookkeeping ops are marked in the file
and hidden unless ``--internal`` (``writer``).

This package does not import torch, so the reading tools run anywhere (the plot needs matplotlib).
"""
from .writer import TimelineRecorder, TraceFile  # noqa: F401

__all__ = ["TimelineRecorder", "TraceFile"]
