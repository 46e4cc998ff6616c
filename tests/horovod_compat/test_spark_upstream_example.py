"""Horovod's examples/spark/pytorch/pytorch_spark_mnist.py, unchanged, on local[2] and on a
local-cluster, with a small synthetic mnist.bz2 (libsvm format) written here.

The example is run from the upstream folder (HOROVOD_UPSTREAM_DIR, default
../shared/upstream/horovod-0.28.1 beside the repository); without it the tests are skipped.
"""
from __future__ import annotations

import bz2
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
from spark_clusters import SPARK_TEST_ENV, SUBMIT_ARGS, mirror_spark_home  # noqa: E402
from tiers import CI  # noqa: E402

pytest.importorskip("pyarrow", reason="the Spark estimators need pyarrow: pip install horovod-compat[spark]")

UPSTREAM = Path(os.environ.get(
    "HOROVOD_UPSTREAM_DIR", Path(__file__).resolve().parents[3] / "shared" / "upstream" / "horovod-0.28.1"
))
EXAMPLE = UPSTREAM / "examples" / "spark" / "pytorch" / "pytorch_spark_mnist.py"

pytestmark = pytest.mark.skipif(
    not EXAMPLE.is_file(),
    reason=f"Horovod's upstream example is not at {EXAMPLE} (set HOROVOD_UPSTREAM_DIR to a "
           "horovod-0.28.1 source folder)",
)


def write_mnist_libsvm(path: Path, rows: int = 4000, seed: int = 0) -> None:
    """A learnable stand-in for MNIST: digit k lights a 4x4 block at a place of its own."""
    rng = random.Random(seed)
    lines = []
    for _ in range(rows):
        label = rng.randrange(10)
        top, left = 4 + 8 * (label // 4), 4 + 6 * (label % 4)
        pixels = {}
        for r in range(top, top + 4):
            for c in range(left, left + 4):
                pixels[r * 28 + c + 1] = round(rng.uniform(0.6, 1.0), 3)
        for _ in range(10):  # noise
            pixels.setdefault(rng.randrange(784) + 1, round(rng.uniform(0.0, 0.3), 3))
        lines.append(f"{label} " + " ".join(f"{i}:{v}" for i, v in sorted(pixels.items())))
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))


def run_example(tmp_path: Path, argv: list, timeout: float = 800, rows: int = 4000,
                epochs: int = 6, batch_size: int = 16) -> str:
    data_dir, work_dir = tmp_path / "data", tmp_path / "work"
    data_dir.mkdir()
    work_dir.mkdir()
    write_mnist_libsvm(data_dir / "mnist.bz2", rows=rows)
    env = {**os.environ, **SPARK_TEST_ENV, "SPARK_HOME": str(mirror_spark_home(tmp_path)),
           "PYSPARK_SUBMIT_ARGS": SUBMIT_ARGS}
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--batch-size", str(batch_size), "--epochs", str(epochs),
         "--data-dir", str(data_dir), "--work-dir", str(work_dir), *argv],
        cwd=str(EXAMPLE.parent), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the example did not finish in {timeout}s:\n{out[-5000:]}")
    assert proc.returncode == 0, f"the example failed ({proc.returncode}):\n{out[-8000:]}"
    # Each rank's epoch lines reach the driver, with Horovod's timestamped rank prefix.
    assert re.search(r"\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\[0\]<stdout>:epoch "
                     rf"{epochs}/{epochs} ", out), out[-5000:]
    accuracy = re.search(r"Test accuracy: ([0-9.]+)", out)
    assert accuracy, out[-5000:]
    # Horovod's layout: the run's checkpoint under <work-dir>/runs/<run_id>/checkpoint.
    checkpoints = list((work_dir / "runs").glob("*/checkpoint"))
    assert len(checkpoints) == 1, sorted(p for p in work_dir.rglob("*"))
    assert list(work_dir.glob("intermediate_train_data.*")) and list(work_dir.glob("intermediate_val_data.*"))
    return out


@pytest.mark.timeout(900)
@pytest.mark.skipif(CI,
                    reason="CI runs the example once, on the local-cluster below (the same script, "
                           "its executors in separate JVMs); this local[2] run is the full suite's")
def test_pytorch_spark_mnist_on_local_2(tmp_path):
    out = run_example(tmp_path, ["--num-proc", "2"])
    assert float(re.search(r"Test accuracy: ([0-9.]+)", out).group(1)) > 0.3, out[-3000:]


@pytest.mark.timeout(900)
def test_pytorch_spark_mnist_on_a_local_cluster(tmp_path):
    """The same script with its executors in JVMs of their own. Its training is the local[2]
    run's (which checks that it learns): here only that it runs to its end, its checkpoint and its
    intermediate data where Horovod puts them, so a smaller data set and fewer, larger steps (16
    per rank instead of 675: 1,000 rows, batches of 32, 1 epoch)."""
    run_example(tmp_path, ["--master", "local-cluster[2,1,1024]", "--num-proc", "2"], rows=1000,
                epochs=1, batch_size=32)
