"""`horovod.spark.run(train, ...)` rewritten to PySpark's own TorchDistributor (runner.py), run on a
real local-cluster: the unchanged program on the horovod-compat shim and the native one on
PySpark's distributor (nothing of this project) print the same losses and the same final weights.
Both run in this test process on the suite's shared local-cluster session, as a notebook on a
cluster runs them; the rewrite's other forms (a used value, env=) are in test_migrate_safety.py.

A long-round test (docs/testing.md): PySpark's distributor takes about 20 s for the native run
alone (each task runs torchrun, which starts the ranks afresh), so CI's round checks the rewrite
only (test_migrate_safety.py) and this file runs without ``CI=true``."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

sys.path.insert(0, str(Path(__file__).parents[2] / "distributor"))
from spark_clusters import LOCAL_CLUSTER, shared_session  # noqa: E402

from horovod_compat.migrate import Kind, migrate_source  # noqa: E402
from tiers import CI  # noqa: E402

# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark local-cluster")

PROGRAM = '''\
import torch
import horovod.torch as hvd
import horovod.spark


def train(steps, lr=0.1):
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    data = torch.Generator().manual_seed(hvd.rank())
    for step in range(steps):
        x = torch.randn(8, 4, generator=data)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        average = hvd.allreduce(loss.detach(), name="loss")
        if hvd.rank() == 0:
            print(f"step {step}: loss {average.item():.6f}", flush=True)
    if hvd.rank() == 0:
        print("weights", round(float(sum(p.detach().sum() for p in model.parameters())), 6), flush=True)


if __name__ == "__main__":
    horovod.spark.run(train, args=(5,), kwargs={"lr": 0.05}, num_proc=2, verbose=0)
'''
#: rank 0's lines; the shim's launcher prefixes them with "[0]<stdout>:", PySpark's does not
LINE = re.compile(r"^(?:\[0\]<stdout>:)?((?:step \d+: loss|weights) \S+)$", re.M)


@pytest.fixture(scope="module")
def spark(request):
    # a plain local-cluster[2,1,1024], shared with the other modules that run on one
    with shared_session(request, LOCAL_CLUSTER, executors=2) as session:
        yield session


def _run(source: str, capfd) -> list:
    """Run `source` as a script's main module in this process; rank 0's lines it printed."""
    capfd.readouterr()
    exec(compile(source, "train_on_spark.py", "exec"), {"__name__": "__main__"})
    captured = capfd.readouterr()
    return LINE.findall(captured.out + captured.err)


@pytest.mark.skipif(CI, reason=(
    "long round (about 40 s: PySpark's TorchDistributor starts torchrun in each task); CI checks the "
    "rewrite in test_migrate_safety.py::test_an_import_of_horovod_spark_goes_once_nothing_uses_it"))
def test_horovod_spark_run_becomes_pysparks_distributor_and_trains_alike(spark, capfd):
    result = migrate_source(PROGRAM, "train_on_spark.py")
    assert [f for f in result.findings if f.kind is Kind.TODO] == []
    assert not re.search(r"^\s*(import|from) (horovod|horovod_compat|distributor)\b", result.source, re.M)
    assert ("TorchDistributor(num_processes=2, local_mode=False, use_gpu=torch.cuda.is_available())"
            ".run(functools.partial(train, lr=0.05), 5)\n") in result.source
    assert "from pyspark.ml.torch.distributor import TorchDistributor\n" in result.source
    original = _run(PROGRAM, capfd)
    native = _run(result.source, capfd)
    assert len(original) == 6 and original[-1].startswith("weights "), original
    assert native == original
