"""``hvd.elastic``: Horovod's elastic-training API (``run``, ``TorchState``, ``ElasticSampler``) for
fixed-size jobs.

Scripts written for elastic Horovod keep working unchanged: ``@hvd.elastic.run`` synchronizes the
state from rank 0 before training, and when a collective fails (``HorovodInternalError``) it restores
every rank to the last ``state.commit()``, re-initializes Horovod, calls the reset callbacks and
runs the training function again.  Hosts are never added or removed here (no driver discovers
hosts), so ``HostsUpdatedInterrupt`` only arrives if user code raises it.
"""
from __future__ import annotations

from .runner import run
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

__all__ = ["run", "TorchState", "ObjectState", "State", "ElasticSampler"]
