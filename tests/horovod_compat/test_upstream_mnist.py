"""Horovod's own examples/pytorch/pytorch_mnist.py, unchanged, under `horovodrun -np 2` and as
`python pytorch_mnist.py --num-proc 2` (which goes through horovod.run).

The script is run from Horovod 0.28.1's files in ../shared/upstream (or HOROVOD_UPSTREAM_DIR);
without them the tests skip. There is no internet here: the test writes a small synthetic MNIST
in torchvision's raw on-disk layout (idx files under <data-dir>/MNIST/raw), which torchvision's
MNIST dataset loads as it would the real one (download=True finds the files and downloads
nothing).
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = Path(os.environ.get("HOROVOD_UPSTREAM_DIR")
                or REPO.parent / "shared" / "upstream" / "horovod-0.28.1")
SCRIPT = UPSTREAM / "examples" / "pytorch" / "pytorch_mnist.py"

pytestmark = [
    pytest.mark.skipif(not SCRIPT.is_file(), reason=f"Horovod's upstream files are not at {UPSTREAM} "
                       "(set HOROVOD_UPSTREAM_DIR to a Horovod 0.28.1 checkout)"),
]


@pytest.fixture(scope="module")
def example_imports():
    """The example's imports beyond this project's own work in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", "import torchvision, filelock, packaging"],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip("the example imports torchvision, filelock and packaging, which this "
                    "environment cannot all import (scripts/test_torchvision.py sets torchvision "
                    f"up for the tests): {done.stderr.strip().splitlines()[-1]}")


def write_mnist(root: Path, train: int = 256, test: int = 128) -> Path:
    """A synthetic MNIST in torchvision's raw layout: idx3 images (28x28 uint8), idx1 labels."""
    import numpy as np

    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, count, dtype=np.uint8)
        # Learnable digits: a bright square whose position encodes the label, plus noise.
        images = rng.integers(0, 40, (count, 28, 28), dtype=np.uint8)
        for i, label in enumerate(labels):
            row, col = divmod(int(label), 5)
            images[i, 4 + row * 12:12 + row * 12, 2 + col * 5:6 + col * 5] = 255
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 2049, count) + labels.tobytes())
    return root


@pytest.fixture()
def mnist_dir(tmp_path, example_imports):
    return write_mnist(tmp_path / "data")


def _run(argv, tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}  # the script locks ~/.horovod_lock
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


EXAMPLE_ARGS = ["--epochs", "1", "--batch-size", "32", "--test-batch-size", "64",
                "--log-interval", "2"]


def _check(done):
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # rank 0 and rank 1 each train on half of the 256 images: 4 batches of 32 each.
    assert re.search(r"\[0\]<stdout>:Train Epoch: 1 \[64/128 \(50%\)\]", out), out
    assert re.search(r"\[1\]<stdout>:Train Epoch: 1 \[64/128 \(50%\)\]", out), out
    assert re.search(r"\[0\]<stdout>:Test set: Average loss: \d+\.\d+, Accuracy: \d+\.\d+%", out), out
    assert "[1]<stdout>:Test set" not in out  # only rank 0 reports


def test_pytorch_mnist_under_horovodrun(mnist_dir, tmp_path):
    done = _run([sys.executable, "-m", "horovod_compat.run", "-np", "2", sys.executable,
                 str(SCRIPT), "--data-dir", str(mnist_dir), *EXAMPLE_ARGS], tmp_path)
    _check(done)


def test_pytorch_mnist_through_horovod_run(mnist_dir, tmp_path):
    done = _run([sys.executable, str(SCRIPT), "--num-proc", "2", "--data-dir", str(mnist_dir),
                 *EXAMPLE_ARGS], tmp_path)
    assert "Running training through horovod.run" in done.stdout
    _check(done)
