"""Unchanged Horovod training programs under `horovodrun -np 2`, each with a hard timeout.

* uneven_join_train.py: uneven data (rank 1 has one batch fewer) + `hvd.join()` +
  DistributedOptimizer, the case that used to hang; its weights must agree across ranks and with
  a run replayed in one process.
* Horovod's examples/pytorch/pytorch_synthetic_benchmark.py, run from ../shared/upstream (skipped,
  with the reason, when that directory or a working torchvision is absent; the suite's
  scripts/test.sh makes torchvision importable via scripts/test_torchvision.py).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_launch import horovodrun

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
UPSTREAM = Path(os.environ.get("HOROVOD_UPSTREAM_DIR", ROOT.parent / "shared" / "upstream" / "horovod-0.28.1"))
EXAMPLES = UPSTREAM / "examples" / "pytorch"


def test_uneven_data_with_join_and_distributed_optimizer():
    run = horovodrun(2, [sys.executable, str(HERE / "uneven_join_train.py")], timeout=180)
    assert not run.timed_out, "uneven data + hvd.join() + DistributedOptimizer hung:\n" + run.tail()
    assert run.returncode == 0, run.tail()
    results = {}
    for rank in (0, 1):
        lines = [line for line in run.rank_lines(rank) if line.startswith("JOIN RESULT ")]
        assert len(lines) == 1, run.tail()
        results[rank] = json.loads(lines[0][len("JOIN RESULT "):])
    # rank 0 has the extra batch, so it joins last, and every rank agrees
    assert results[0]["last_joined"] == results[1]["last_joined"] == [0, 0]
    assert results[0]["weights"] == pytest.approx(results[1]["weights"], abs=1e-6)
    assert results[0]["weights"] == pytest.approx(results[0]["expected"], rel=1e-4, abs=1e-5)
    losses = results[0]["losses"]
    assert len(losses) == 8 and len(results[1]["losses"]) == 6
    assert losses[-1] < losses[0]


def _torchvision_problem():
    probe = subprocess.run([sys.executable, "-c", "import torchvision.models"], capture_output=True, text=True,
                           timeout=120)
    if probe.returncode:
        return ("torchvision does not import (" + (probe.stderr.strip().splitlines() or ["?"])[-1]
                + "); run `.venv/bin/python scripts/test_torchvision.py` (scripts/test.sh does)")
    return None


@pytest.mark.skipif(not (EXAMPLES / "pytorch_synthetic_benchmark.py").is_file(),
                    reason=f"Horovod's upstream examples are not here ({EXAMPLES}); they are not part of this "
                           "repository: set HOROVOD_UPSTREAM_DIR to a Horovod 0.28.1 checkout")
@pytest.mark.timeout(700)
def test_pytorch_synthetic_benchmark_unchanged(tmp_path):
    problem = _torchvision_problem()
    if problem:
        pytest.skip(problem)
    run = horovodrun(2, [sys.executable, str(EXAMPLES / "pytorch_synthetic_benchmark.py"), "--model", "resnet18",
                         "--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
                         "--num-iters", "2", "--no-cuda"],
                     timeout=600, cwd=str(tmp_path))
    assert not run.timed_out, "pytorch_synthetic_benchmark.py hung:\n" + run.tail()
    assert run.returncode == 0, run.tail()
    out = "\n".join(run.rank_lines(0))
    assert "Model: resnet18" in out and "Number of CPUs: 2" in out, run.tail()
    assert len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per CPU$", out, re.M)) == 2, run.tail()
    total = re.search(r"^Total img/sec on 2 CPU\(s\): ([\d.]+) \+-[\d.]+$", out, re.M)
    assert total and float(total.group(1)) > 0, run.tail()
