"""``hvd.elastic``: Horovod's elastic-training API (``run``, ``TorchState``, ``ElasticSampler``).

In an elastic job (started with an ``ElasticPolicy``, e.g. ``distributor.run_function(...,
elastic=ElasticPolicy(min_workers, max_workers))``) a worker that dies is replaced
while the others keep their memory: ``@hvd.elastic.run`` catches the failed collective, restores the
last ``state.commit()``, re-joins the job's next rendezvous round (``hvd.init()`` asks the driver),
syncs the state from rank 0 and calls the training function again.  Hosts that come or go are
announced by the driver and raise ``HostsUpdatedInterrupt`` at the next ``state.commit()`` on every
rank at once.  In a fixed-size job the same loop retries after a failed collective in the same
world, at most ``HOROVOD_ELASTIC_RESET_LIMIT`` times.
"""
from __future__ import annotations

from horovod_compat.common.elastic import run
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

__all__ = ["run", "TorchState", "ObjectState", "State", "ElasticSampler"]
