"""The binding's one compiled piece: the ``HorovodCompatCheck`` TensorFlow op (``check_op.cc``).

A collective inside a graph is a ``tf.numpy_function`` node, and TensorFlow reports every Python
exception raised there as ``UnknownError``.  Horovod's kernels fail with the failure's own status
(``FailedPreconditionError`` for ranks that disagree on an op), which programs catch.  With this op
a node returns the status as two extra outputs and ``HorovodCompatCheck`` fails the step with it,
or forwards the node's results unchanged.

The op is compiled on first use, against the TensorFlow that is installed, with the C++ compiler
(``$CXX``, else ``c++``), into ``$HOROVOD_COMPAT_CACHE_DIR`` (default
``$XDG_CACHE_HOME/horovod_compat``, else ``~/.cache/horovod_compat``), once per TensorFlow version,
compiler flags and source: 5-30 s, by one process at a time (the ranks of a host start together:
one compiles, the others wait for its library), after which every process loads the cached
library.  The process that compiles says so in one line on stderr before it starts
(``ANNOUNCEMENT``), which the launchers show as that rank's output; a process that loads the
cached library, or waits for another's compile, prints nothing.  Where it cannot be built (no
compiler, no TensorFlow headers) or ``HOROVOD_COMPAT_TF_NATIVE=0``, graph nodes raise as before
(``UnknownError`` carrying Horovod's message), and a warning and ``status()`` say why.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import tensorflow as tf

__all__ = ["check_op", "status", "cache_dir"]

_log = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("check_op.cc")
_lock = threading.Lock()
_loaded: Optional[Any] = None
_why_not: Optional[str] = None
_tried = False


def cache_dir() -> Path:
    """Where compiled libraries are kept (see the module's docstring)."""
    explicit = os.environ.get("HOROVOD_COMPAT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "horovod_compat"


#: The line the compiling process prints on stderr before it compiles (``str.format``: ``version``,
#: ``cache``).
ANNOUNCEMENT = ("horovod_compat: compiling the TensorFlow check op for TensorFlow {version}, once "
                "per machine and cache (about 5-30 s; the other ranks of this host wait for it); "
                "cached in {cache}")


def _build() -> Path:
    compiler = os.environ.get("CXX", "c++")
    flags = list(tf.sysconfig.get_compile_flags()) + list(tf.sysconfig.get_link_flags())
    key = hashlib.sha256("\0".join([_SOURCE.read_text(), tf.__version__, compiler, *flags])
                         .encode()).hexdigest()[:16]
    target = cache_dir() / f"tf-{tf.__version__}-{key}" / "check_op.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # one process builds, the others (the ranks of a host start together) wait for its library
    with open(target.with_name(".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        if shutil.which(compiler) is None:  # nothing to compile with: no announcement
            raise RuntimeError(f"could not run the C++ compiler {compiler!r}: not found")
        print(ANNOUNCEMENT.format(version=tf.__version__, cache=cache_dir()), file=sys.stderr,
              flush=True)
        return _compile(compiler, flags, target)


def _compile(compiler: str, flags: list, target: Path) -> Path:
    partial = target.with_name(f".check_op.{os.getpid()}.{threading.get_ident()}.so")
    cmd = [compiler, "-shared", "-fPIC", "-O2", "-w", str(_SOURCE), "-o", str(partial), *flags]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run the C++ compiler {compiler!r}: {exc}") from exc
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    os.replace(partial, target)  # atomic: a process never loads a partly written file
    return target


def check_op() -> Optional[Any]:
    """``HorovodCompatCheck(code, message, values) -> values``, or None where it is unavailable."""
    global _loaded, _why_not, _tried
    if _tried:
        return _loaded
    with _lock:
        if not _tried:
            switch = os.environ.get("HOROVOD_COMPAT_TF_NATIVE", "1").strip().lower()
            if switch in ("0", "false", "no"):
                _why_not = "disabled by HOROVOD_COMPAT_TF_NATIVE=0"
            else:
                # a missing compiler or missing headers must not stop training
                try:
                    library = _build()
                except Exception as exc:
                    _why_not = f"compiling {_SOURCE.name} failed: {exc}"
                else:
                    try:
                        _loaded = tf.load_op_library(str(library)).horovod_compat_check
                    except Exception as exc:
                        _why_not = f"loading the compiled {library} failed: {exc}"
                if _why_not is not None:
                    _log.warning("horovod_compat: the TensorFlow check op is not available (%s); "
                                 "training goes on, but a collective that fails inside a graph "
                                 "raises UnknownError (with Horovod's message) instead of its own "
                                 "error type. To have the op, install a C++ compiler (or name one "
                                 "in $CXX) and TensorFlow's headers; HOROVOD_COMPAT_TF_NATIVE=0 "
                                 "skips it", _why_not)
            _tried = True
    return _loaded


def status() -> str:
    """One line: whether graph nodes report Horovod's error types, and if not, why."""
    if check_op() is not None:
        return "compiled error-status op loaded"
    return f"not available ({_why_not})"
