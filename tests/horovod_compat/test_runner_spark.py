"""HorovodRunner(np > 0): ranks as a Spark barrier stage on a real local-cluster."""
from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
from spark_clusters import LOCAL_CLUSTER, no_active_jobs, shared_session  # noqa: E402

from distributor import RankFailedError  # noqa: E402
from horovod_compat.runner import HorovodRunner  # noqa: E402
from procs import left_after  # noqa: E402


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark local-cluster")


@pytest.fixture(scope="module")
def spark(request):
    # a plain local-cluster[2,1,1024], shared with the other modules that run on one
    with shared_session(request, LOCAL_CLUSTER, executors=2) as session:
        yield session


def train_hvd(learning_rate):
    import os

    import torch

    import horovod.torch as hvd
    from sparkdl.horovod import log_to_driver

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=learning_rate),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.full((8, 4), float(hvd.rank() + 1))
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    log_to_driver(f"rank {hvd.rank()} of {hvd.size()} trained")
    print(f"plain print from rank {hvd.rank()}")
    weights = hvd.allgather(model.weight.detach())
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        parent = cmdline.read().split(b"\0")[0].decode()
    chain = hvd.allgather_object((os.environ.get("OMPI_COMM_WORLD_RANK"), os.path.basename(parent), _in_spark_worker()))
    return {"chain": chain, "size": hvd.size(), "replicas_equal": bool((weights[0] == weights[1]).all()),
            "timeline": os.environ.get("HOROVOD_TIMELINE")}


def _in_spark_worker():
    """True if an ancestor of this process is a PySpark Python worker (the rank is in a task)."""
    import os

    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
            return True
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return False


def test_np_positive_trains_on_the_cluster(spark, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HOROVOD_TIMELINE", str(tmp_path / "tl.json"))
    result = HorovodRunner(np=2).run(train_hvd, learning_rate=0.1)
    assert result["size"] == 2 and result["replicas_equal"]
    # Started by one mpirun across the tasks: MPI ranks, each under an Open MPI daemon that its
    # own Spark task runs.
    assert result["chain"] == [("0", "prted", True), ("1", "prted", True)]
    assert result["timeline"] == str(tmp_path / "tl.json")
    out = capsys.readouterr().out
    assert "rank 0 of 2 trained" in out and "rank 1 of 2 trained" in out
    # log_callback_only (the default on a cluster): a plain print is not shown, but counted
    assert "plain print" not in out
    assert re.search(r'^HorovodRunner: the ranks printed [1-9]\d* line\(s\) that were not shown: '
                     r'driver_log_verbosity="log_callback_only" .* driver_log_verbosity="all"\) '
                     r"shows every line\.$", out, re.M), out


def fail_on_rank1():
    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad batch on rank 1")
    hvd.barrier()


def test_np_positive_failure_is_the_rank_error_not_a_spark_dump(spark, monkeypatch):
    marker = f"HOROVOD_TEST_MARKER_{uuid.uuid4().hex}"
    monkeypatch.setenv("HOROVOD_TEST_MARKER", marker)  # forwarded to every rank like HOROVOD_*
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=2).run(fail_on_rank1)
    assert info.value.rank == 1 and info.value.exc_type == "ValueError"
    assert "Py4JJavaError" not in str(info.value)
    assert no_active_jobs(spark)
    assert left_after(marker) == [], "mpirun, prted or a rank outlived the job"


def test_np_above_the_slots_fails_at_once(spark):
    with pytest.raises(Exception, match="slot"):
        HorovodRunner(np=5).run(fail_on_rank1)
