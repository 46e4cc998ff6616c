"""Shared pieces of the upstream-script tests: where Horovod's scripts are, tiny synthetic data in
the layouts they read, running a script on 2 ranks, and reading its per-epoch metrics.

The scripts are read from ../shared/upstream/horovod-0.28.1 (HOROVOD_UPSTREAM_DIR overrides) and
never copied into the repository; their rewritten versions are produced at test time.
"""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from warm import run_script_warm

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = Path(os.environ.get("HOROVOD_UPSTREAM_DIR") or ROOT.parent / "shared" / "upstream" / "horovod-0.28.1")
MISSING = (f"Horovod's upstream scripts are not at {UPSTREAM} (set HOROVOD_UPSTREAM_DIR to a "
           "horovod-0.28.1 checkout to run these tests)")

#: Every upstream PyTorch script the rewriter must migrate.
SCRIPTS = (
    "examples/pytorch/pytorch_mnist.py",
    "examples/pytorch/pytorch_synthetic_benchmark.py",
    "examples/pytorch/pytorch_imagenet_resnet50.py",
    "examples/pytorch/pytorch_lightning_mnist.py",
    "examples/elastic/pytorch/pytorch_mnist_elastic.py",
    "examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py",
    "examples/elastic/pytorch/pytorch_imagenet_resnet50_elastic.py",
)


def upstream_present() -> bool:
    """True when every script in SCRIPTS is readable."""
    return all((UPSTREAM / s).is_file() for s in SCRIPTS)


def _idx(path: Path, magic: int, dims: Sequence[int], data: bytes) -> None:
    path.write_bytes(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + data)


def write_mnist(root: Path, train: int = 96, test: int = 40, seed: int = 0) -> Path:
    """Synthetic MNIST in torchvision's raw on-disk layout (``root/MNIST/raw/*-ubyte``), so
    ``datasets.MNIST(root, download=True)`` finds it and never downloads.  Each image is a blob
    whose position depends on its label, so there is something to learn."""
    import torch

    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for prefix, count in (("train", train), ("t10k", test)):
        labels = torch.randint(0, 10, (count,), generator=gen, dtype=torch.uint8)
        images = (torch.rand(count, 28, 28, generator=gen) * 60).to(torch.uint8)
        for i, label in enumerate(labels.tolist()):
            row, col = 2 + (label // 5) * 12, 2 + (label % 5) * 5
            images[i, row:row + 10, col:col + 5] = 255
        _idx(raw / f"{prefix}-images-idx3-ubyte", 0x803, (count, 28, 28), images.numpy().tobytes())
        _idx(raw / f"{prefix}-labels-idx1-ubyte", 0x801, (count,), labels.numpy().tobytes())
    return root


def write_image_folder(root: Path, classes: int = 2, per_class: int = 4, size: int = 40, seed: int = 0) -> Path:
    """A tiny synthetic ImageFolder (``root/<class>/<n>.png``)."""
    import torch
    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            pixels = (torch.rand(size, size, 3, generator=gen) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(folder / f"{n}.png")
    return root


def run_ranks(script: Path, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
              timeout: float = 600) -> List[str]:
    """Run `script` on 2 local ranks under the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT: the engine's script mode, its ranks forked warm: tests/warm.py);
    return rank 0's stdout lines.  A failing rank raises with its traceback."""
    lines: List[str] = []

    def keep(rank, stream, line):
        if rank == 0 and stream == "stdout":
            lines.append(line)

    run_script_warm(str(script), list(argv), num_processes=2,
               env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})},
               timeout=timeout, output=keep)
    return lines


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def metrics(lines: Sequence[str], prefixes: Sequence[str]) -> List[str]:
    """The lines starting with one of `prefixes` (after leading whitespace), stripped."""
    return [line.strip() for line in lines if line.strip().startswith(tuple(prefixes))]


def assert_same_metrics(actual: Sequence[str], expected: Sequence[str], rel: float = 1e-4) -> None:
    """Same metric lines: identical text around the numbers, numbers equal within `rel`."""
    assert expected, "the reference run printed no metric lines"
    assert len(actual) == len(expected), (actual, expected)
    for got, want in zip(actual, expected):
        assert _NUMBER.sub("#", got) == _NUMBER.sub("#", want), (got, want)
        for a, b in zip(_NUMBER.findall(got), _NUMBER.findall(want)):
            assert abs(float(a) - float(b)) <= rel * max(abs(float(b)), 1.0), (got, want)
