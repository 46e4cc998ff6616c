"""Test environment only: install tf-keras (Keras 2) without its dependencies beside tensorflow-cpu.

Horovod's Keras-2 test files and examples run with ``TF_USE_LEGACY_KERAS=1``, which makes
``tf.keras`` the ``tf_keras`` package. tf-keras requires the distribution ``tensorflow``; the test
extra installs ``tensorflow-cpu`` (the same ``tensorflow`` package without the CUDA libraries), so
letting pip resolve tf-keras would install the full ``tensorflow`` wheel on top of it. Hence this
script, run by ``scripts/bootstrap.sh`` with the venv's python, installs tf-keras with
``--no-deps``; ``pip check`` then says "tf-keras ... requires tensorflow, which is not installed",
which is expected.

The version: what the constraints file (the lock, constraints.txt) pins; with a constraints file that
does not pin tf-keras (``scripts/test_latest.sh``), the newest tf-keras of the installed TensorFlow's
minor release (tf-keras X.Y requires TensorFlow X.Y). Nothing happens when TensorFlow is not installed
or the wanted tf-keras already is, so it is idempotent.

    python scripts/test_tf_keras.py [CONSTRAINTS]   # default: constraints.txt
    HOROVOD_COMPAT_UPGRADE=1 ...                    # without a pin: upgrade to the newest of the minor
"""
from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
from typing import List, Optional

from lock import LOCK, read_lock  # scripts/lock.py, beside this file


def _version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def wanted(pins: dict, tensorflow: Optional[str], have: Optional[str], upgrade: bool) -> Optional[str]:
    """The requirement to install with ``--no-deps``, or None when there is nothing to do."""
    if tensorflow is None:
        return None
    pin = pins.get("tf-keras")
    if pin is not None:
        return None if have == pin else f"tf-keras=={pin}"
    major, minor = (int(part) for part in tensorflow.split(".")[:2])
    if upgrade or have is None or have.split(".")[:2] != [str(major), str(minor)]:
        return f"tf-keras>={major}.{minor},<{major}.{minor + 1}"
    return None


def main(argv: List[str]) -> int:
    constraints = argv[0] if argv else LOCK
    upgrade = os.environ.get("HOROVOD_COMPAT_UPGRADE", "0") == "1"
    requirement = wanted(read_lock(constraints), _version("tensorflow-cpu") or _version("tensorflow"),
                         _version("tf-keras"), upgrade)
    if requirement is None:
        return 0
    print(f"test_tf_keras: installing {requirement} without dependencies (see scripts/test_tf_keras.py)",
          file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-deps", *(["--upgrade"] if upgrade else []), requirement], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
