"""PyTorch Lightning's DDP inside a TorchDistributor function, in local mode (no Spark needed).

The cluster variant (`devices=1, num_nodes=2` on a local-cluster) lives in
test_spark_placement.py, which owns that module's SparkSession. Lightning is an optional test
extra (`pip install lightning`); without it these tests are skipped and say so.
"""
from __future__ import annotations

import importlib.util

import pytest

from distributor import TorchDistributor

from test_spark_placement import _lightning_fit

# found, not imported: importing Lightning takes seconds of CPU, which every worker of the suite
# paid at collection (the ranks import it)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="lightning is an optional test extra: pip install lightning")


def test_lightning_ddp_fit_in_local_mode(monkeypatch):
    monkeypatch.setenv("FIT_DEVICES", "2")
    monkeypatch.setenv("FIT_NODES", "1")
    # The engine passes the driver's environment on to the ranks in local mode.
    rank, world, node, gathered = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(_lightning_fit)
    assert (rank, world, node) == (0, 2, 0)
    assert len(gathered) == 2 and gathered[0] == gathered[1], "DDP replicas diverged"
