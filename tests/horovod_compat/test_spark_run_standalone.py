"""horovod.spark.run on the standalone master + worker the tests start (pyspark's spark-class),
stopped by PID at the end; shared with tests/distributor/test_spark_standalone.py when both run in
one process."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
from spark_clusters import shared_standalone_session  # noqa: E402

import horovod.spark  # noqa: E402


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark standalone")


@pytest.fixture(scope="module")
def cluster(request):
    with shared_standalone_session(request) as both:
        yield both


def where():
    import os

    import horovod.torch as hvd

    hvd.init()
    print(f"rank {hvd.rank()} works in {os.getcwd()}")
    return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), os.getcwd()


def test_both_modes_on_a_standalone_cluster(cluster):
    standalone, _session = cluster
    for use_mpi in (False, True):
        out = io.StringIO()
        results = horovod.spark.run(where, num_proc=2, use_mpi=use_mpi, stdout=out)
        assert [r[:4] for r in results] == [(0, 2, 0, 2), (1, 2, 1, 2)], use_mpi
        assert all(Path(r[4]).is_relative_to(standalone.work_dir) for r in results), results
        assert "[1]<stdout>:rank 1 works in" in out.getvalue()
