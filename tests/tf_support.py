"""Test helper: a synthetic, learnable MNIST where Keras and Horovod's Keras examples look for it.

There is no internet in CI, and both Keras 3 (``keras.datasets.mnist.load_data``) and tf-keras
(``tf_keras.datasets.mnist.load_data``, what ``tf.keras`` is under ``TF_USE_LEGACY_KERAS=1``) load
MNIST through ``get_file(fname=path, origin=..., file_hash=<the real file's sha256>)``: a cached file
whose sha256 differs is "incomplete or outdated" and downloaded again
(``keras/src/utils/file_utils.py`` and ``tf_keras/src/utils/data_utils.py``, both through their
module-level ``validate_file``). So `keras_mnist_env` writes, under a temporary directory:

- ``home/.keras/datasets/mnist.npz`` (and ``mnist-0.npz`` ... for the examples that load
  ``path='mnist-%d.npz' % hvd.rank()``): where tf-keras looks (``$HOME/.keras/datasets``) and where
  Keras 3 looks (``$KERAS_HOME/datasets``), HOME and KERAS_HOME pointing there — never the user's home;
- ``site/sitecustomize.py``, first on the subprocess's PYTHONPATH: when ``keras.src.utils.file_utils``
  or ``tf_keras.src.utils.data_utils`` is imported, it wraps their ``validate_file`` so that a file
  named ``mnist*.npz`` in one of the directories that ``HOROVOD_COMPAT_TEST_DATASETS`` lists is
  accepted; every other file is checked as before. Installed packages are not modified, and nothing
  is imported before Keras is (sitecustomize runs in every process of the job, ranks included).

and returns the environment variables to give the subprocess. `write_mnist_libsvm` writes the same
digits as the libsvm ``mnist.bz2`` that Horovod's Spark examples (``keras_spark_mnist.py``,
``pytorch_spark_mnist.py``) read with ``spark.read.format('libsvm').option('numFeatures', '784')``.

The digits: class k is a horizontal bar at a row of its own and a vertical bar at a column of its
own, shifted by up to a pixel, with random intensity and sparse background noise — a small dense or
convolutional model learns it in an epoch.
"""
from __future__ import annotations

import bz2
import os
import textwrap
from pathlib import Path
from typing import Dict, Iterable, Tuple

import numpy as np

#: The environment variable that names the directories whose mnist*.npz files are accepted.
DATASETS_VARIABLE = "HOROVOD_COMPAT_TEST_DATASETS"

_ROWS = (5, 9, 13, 17, 21)  # class k: a horizontal bar at _ROWS[k % 5] ...
_COLUMNS = (8, 19)          # ... and a vertical bar at _COLUMNS[k // 5]

Arrays = Tuple[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]


def synthetic_digits(count: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """``(images, labels)``: `count` uint8 images of shape (28, 28) and their uint8 labels 0-9."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count).astype(np.uint8)
    images = np.zeros((count, 28, 28), dtype=np.uint8)
    shifts = rng.integers(-1, 2, size=(count, 2))
    intensity = rng.integers(150, 256, size=count)
    for i, label in enumerate(labels):
        row = _ROWS[label % 5] + shifts[i, 0]
        column = _COLUMNS[label // 5] + shifts[i, 1]
        images[i, row:row + 2, 3:25] = intensity[i]
        images[i, 3:25, column:column + 2] = intensity[i]
    noise = rng.random((count, 28, 28)) < 0.03  # sparse, so that the libsvm file stays small
    images[noise] = np.maximum(images[noise], rng.integers(20, 120, size=int(noise.sum())))
    return images, labels


def synthetic_mnist(train: int = 4000, test: int = 1000, seed: int = 0) -> Arrays:
    """``(x_train, y_train), (x_test, y_test)`` as ``mnist.load_data()`` returns them."""
    return synthetic_digits(train, seed), synthetic_digits(test, seed + 1)


def write_mnist_npz(path: Path, data: Arrays) -> Path:
    """Write `data` in the layout of Keras's mnist.npz (keys x_train, y_train, x_test, y_test)."""
    (x_train, y_train), (x_test, y_test) = data
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to other names
        np.savez_compressed(f, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def write_mnist_libsvm(path: Path, rows: int = 4000, seed: int = 0) -> Path:
    """The same digits as libsvm's ``mnist.bz2`` (label, then 1-based ``index:value`` pairs of the
    784 pixels that are not 0, values scaled to [0, 1]) for Horovod's Spark examples."""
    images, labels = synthetic_digits(rows, seed)
    lines = []
    for image, label in zip(images.reshape(rows, 784), labels):
        nonzero = np.flatnonzero(image)
        lines.append(f"{label} " + " ".join(f"{i + 1}:{image[i] / 255:.3f}" for i in nonzero))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    return path


#: What every test sitecustomize here starts with: a finder that patches a module right after it
#: runs, and the call that runs the next sitecustomize on sys.path (Python runs only the first).
SITE_HELPERS = textwrap.dedent('''\
    import importlib
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _HERE = os.path.dirname(os.path.abspath(__file__))


    class _PatchAfterImport(importlib.abc.MetaPathFinder):
        """Call ``patches[name](module)`` right after module ``name`` has run."""

        def __init__(self, patches):
            self.patches = patches

        def find_spec(self, fullname, path, target=None):
            patch = self.patches.get(fullname)
            if patch is None:
                return None
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_and_patch
            return spec


    def _run_next_sitecustomize():
        """Python runs only the first sitecustomize on sys.path: run the one this file hides."""
        spec = importlib.machinery.PathFinder.find_spec(
            "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE])
        if spec is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
''')

SITECUSTOMIZE = textwrap.dedent('''\
    """Test only, written by horovod-compat's tests/tf_support.py: Keras and tf-keras accept the
    synthetic mnist*.npz files in the directories that $HOROVOD_COMPAT_TEST_DATASETS lists instead of
    downloading MNIST again because their sha256 is not the real file's."""
''') + SITE_HELPERS + textwrap.dedent('''\

    _DIRS = {os.path.realpath(d) for d in os.environ.get("HOROVOD_COMPAT_TEST_DATASETS", "").split(os.pathsep) if d}


    def _accept_test_mnist(module):
        validate_file = module.validate_file

        def validate(fpath, file_hash, *args, **kwargs):
            name = os.path.basename(str(fpath))
            if (name.startswith("mnist") and name.endswith(".npz")
                    and os.path.realpath(os.path.dirname(str(fpath))) in _DIRS):
                return True
            return validate_file(fpath, file_hash, *args, **kwargs)

        validate.__wrapped__ = validate_file
        module.validate_file = validate


    if _DIRS:
        sys.meta_path.insert(0, _PatchAfterImport({"keras.src.utils.file_utils": _accept_test_mnist,
                                                   "tf_keras.src.utils.data_utils": _accept_test_mnist}))
    _run_next_sitecustomize()
''')


def keras_mnist_env(tmp: Path, data: Arrays = None, ranks: int = 4,
                    names: Iterable[str] = ()) -> Dict[str, str]:
    """Write the synthetic MNIST (`data`, default ``synthetic_mnist()``) as ``mnist.npz`` and
    ``mnist-<r>.npz`` for r < `ranks` (plus `names`) where Keras 3 and tf-keras look, and the
    sitecustomize that lets them load it offline; return the variables to set in a subprocess's
    environment (``{**os.environ, **keras_mnist_env(tmp)}``): HOME, KERAS_HOME, PYTHONPATH (the
    current one, after the sitecustomize's directory) and HOROVOD_COMPAT_TEST_DATASETS."""
    tmp = Path(tmp)
    data = synthetic_mnist() if data is None else data
    home = tmp / "home"
    keras_home = home / ".keras"
    # Keras 3: $KERAS_HOME/datasets; tf-keras: $HOME/.keras/datasets (the same directory here)
    directories = sorted({keras_home / "datasets", home / ".keras" / "datasets"})
    files = ["mnist.npz", *(f"mnist-{rank}.npz" for rank in range(ranks)), *names]
    for directory in directories:
        first = write_mnist_npz(directory / files[0], data)
        for name in files[1:]:
            (directory / name).write_bytes(first.read_bytes())
    site = tmp / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    pythonpath = os.environ.get("PYTHONPATH")
    return {
        "HOME": str(home),
        "KERAS_HOME": str(keras_home),
        "PYTHONPATH": os.pathsep.join([str(site), *([pythonpath] if pythonpath else [])]),
        DATASETS_VARIABLE: os.pathsep.join(str(d) for d in directories),
    }
