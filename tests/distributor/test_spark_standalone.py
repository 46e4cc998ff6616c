"""The Spark placement on a standalone cluster the test starts: a master and a worker on
127.0.0.1 (pyspark's spark-class), executors' work directories in a temporary folder, everything
stopped by PID at the end; shared with test_spark_run_standalone.py when both run in one process."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from distributor import TorchDistributor

from spark_clusters import PYSPARK_DIR, shared_standalone_session


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark standalone")


@pytest.fixture(scope="module")
def cluster(request):
    with shared_standalone_session(request) as both:
        yield both


def _where(tag):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return tag, os.environ["WORLD_SIZE"], t.item(), os.getcwd()


def test_torch_distributor_on_a_standalone_cluster(cluster):
    standalone, _session = cluster
    site_work = PYSPARK_DIR / "work"
    existed = site_work.exists()
    tag, world, total, cwd = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_where, "x")
    assert (tag, world, total) == ("x", "2", 2.0)
    assert Path(cwd).is_relative_to(standalone.work_dir), f"executor work dir {cwd} is not under --work-dir"
    assert site_work.exists() == existed, "an executor work directory landed inside site-packages"
