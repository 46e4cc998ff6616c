"""``horovod``: an alias package that makes Horovod-era code run on horovod-compat.

``import horovod.torch as hvd`` (and ``horovod.torch.mpi_ops``, ``horovod.torch.elastic``,
``horovod.common.exceptions``, ...) resolves to ``horovod_compat.torch`` -- the same module objects,
not copies -- through the meta-path finder in ``horovod_compat._alias``.  This package contains
nothing else.

If a real Horovod is also installed
-----------------------------------
Both distributions own the top-level ``horovod`` package, so they cannot be installed in the same
environment (pip would let the last install overwrite the other's ``horovod/__init__.py`` and leave
a mix of files).  Our decision:

* horovod-compat wins in an environment where it is installed: its finder sits at the front of
  ``sys.meta_path``, so ``horovod.torch`` is ours even if a real Horovod's compiled files are still
  on disk next to this file; a warning then names the leftover files
  (``pip uninstall horovod horovod-compat && pip install horovod-compat`` cleans up).
* ``HOROVOD_COMPAT_DISABLE_ALIAS=1`` turns the alias off: ``horovod.*`` submodules then load from
  whatever is on disk (useful to compare against a real Horovod kept in that environment, or, better,
  in a separate venv: see ``benchmarks/collectives.py --horovod-python``).
* If a real Horovod was installed *after* horovod-compat, its ``horovod/__init__.py`` replaced this
  file and the real Horovod is used; ``horovod_compat.torch`` stays importable under its own name.

``horovod.run`` (Horovod's ``horovod.runner.run``) is loaded on first use; ``horovod.spark`` resolves
to ``horovod_compat.spark``; ``horovod.tensorflow``, ``horovod.keras`` and ``horovod._keras`` to the
TensorFlow and Keras bindings; ``horovod.ray`` to ``horovod_compat.ray`` (with the ``ray`` extra).
``horovod.mxnet`` raises ``ModuleNotFoundError`` saying what this project provides instead
(``horovod_compat.frameworks``).
"""
import glob as _glob
import os as _os
import warnings as _warnings

from horovod_compat._alias import install as _install
from horovod_compat.frameworks import unsupported_message as _unsupported_message
from horovod_compat.frameworks import unsupported_prefix as _unsupported_prefix

__version__ = "0.28.1"  # the Horovod API version this package reproduces

_install("horovod", "horovod_compat",
         {"horovod.common": "horovod_compat.common",
          "horovod.common.exceptions": "horovod_compat.common.exceptions",
          "horovod.common.util": "horovod_compat.common.util",
          "horovod.runner": "horovod_compat.launch"},
         explain=lambda name: _unsupported_message(name) if _unsupported_prefix(name) else None)


def __getattr__(name):
    if name == "run":  # Horovod's horovod.run(func, ...), imported on first use
        from horovod_compat.launch import run

        return run
    raise AttributeError(f"module 'horovod' has no attribute {name!r}")


_here = _os.path.dirname(__file__)
_leftovers = [p for p in _glob.glob(_os.path.join(_here, "**", "*.so"), recursive=True)]
if _leftovers and _os.environ.get("HOROVOD_COMPAT_DISABLE_ALIAS", "0") in ("", "0"):
    _warnings.warn(f"A real Horovod's compiled files are installed next to horovod-compat's "
                   f"'horovod' alias package ({_leftovers[:2]}...); horovod-compat is used. "
                   "Uninstall one of them (see horovod/__init__.py).", RuntimeWarning)
