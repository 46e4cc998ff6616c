"""The typed failure report: how a rank tells the driver whether its failure is a cause or the
knock-on of another rank's, for every kind of target.

The engine names the rank whose failure came first in causal order. A rank whose collective failed
because a peer died, left or stopped responding is not that rank; it says so with three fields:

* ``knock_on`` (bool): this failure is the consequence of another rank's;
* ``peer`` (int or None): the rank (global, as the driver numbers them) whose failure it was;
* ``frozen`` (bool): that peer did not die but stopped making progress while this rank waited.

A function or script target runs inside the rank process: `distributor.rank_entry` reads the
fields from the exception's attributes of the same names (`fields`), on the exception or on one it
was raised from or during (``__cause__``/``__context__``). A command target is another program:
`rank_entry` gives it the variable ``DISTRIBUTOR_FAILURE_FILE`` (a path of its own, per rank, that
does not exist yet), and the program may write there one JSON object describing its failure before
it exits (`write` does it for a Python exception)::

    {"exc_type": "HorovodInternalError", "exc_message": "...", "knock_on": true, "peer": 2,
     "frozen": false, "time": 1718000000.12}

``time`` is ``time.time()`` when the failure happened. The first report written is kept (``write``
creates the file atomically and never replaces one). `rank_entry` sends it to the driver as soon as
it appears, and again, with the command's exit status or signal, when the command exits. Programs
that write nothing (a plain torch script) are classified from the traceback they print, and a
report without ``knock_on`` (an exception that says neither, such as gloo's "Connection closed by
peer") from its message.

A Python program installs `install_excepthook` instead: it writes the report of an uncaught
exception, prints it as before, and shortens the teardown that follows (`_teardown_after_failure`).

This module is stdlib only: the Horovod runtime imports it in every rank, and any program may copy
the protocol without it.
"""
from __future__ import annotations

import atexit
import gc
import io
import json
import os
import sys
import time
from typing import Any, Dict, Optional

#: The variable naming the file a command rank may write its failure report to.
FAILURE_FILE_VAR = "DISTRIBUTOR_FAILURE_FILE"
#: The keys of a report that `read` accepts, with their types.
_KEYS = {"exc_type": str, "exc_message": str, "knock_on": bool, "peer": int, "frozen": bool,
         "time": float}
_MAX_BYTES = 1 << 16


def fields(exc: BaseException) -> Dict[str, Any]:
    """``knock_on``/``peer``/``frozen`` of a failure with exception `exc`: knock-on when `exc`, or
    an exception it was raised from or while handling, says it is (an attribute ``knock_on``
    that is true; the first such exception names the peer), a cause when one says it is not
    (``knock_on`` false) and none says it is; none of them when no exception of the chain says
    either (a torch or gloo error): the driver then reads the message (`engine.is_knock_on`)."""
    seen = set()
    said_cause = False
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        flag = getattr(current, "knock_on", None)
        if flag is True:
            peer = getattr(current, "peer", None)
            return {"knock_on": True, "peer": peer if isinstance(peer, int) else None,
                    "frozen": bool(getattr(current, "frozen", False))}
        said_cause = said_cause or flag is False
        current = current.__cause__ or current.__context__
    return {"knock_on": False, "peer": None, "frozen": False} if said_cause else {}


def report(exc: BaseException) -> Dict[str, Any]:
    """The report of a failure with exception `exc`, now."""
    return {"exc_type": type(exc).__qualname__, "exc_message": str(exc), **fields(exc),
            "time": time.time()}


def write(exc: BaseException, path: Optional[str] = None) -> bool:
    """Write `exc`'s report to `path` (default: ``$DISTRIBUTOR_FAILURE_FILE``) unless a report is
    there already; True if written. Never raises."""
    path = path or os.environ.get(FAILURE_FILE_VAR)
    if not path:
        return False
    try:
        data = json.dumps(report(exc)).encode()
        part = f"{path}.{os.getpid()}.part"
        with open(part, "wb") as handle:
            handle.write(data)
        try:
            os.link(part, path)  # atomic, and fails if a report is there: the first one wins
        except FileExistsError:
            os.unlink(part)
            return False
        except OSError:  # no hard links here: still atomic, but the last one wins
            os.replace(part, path)
            return True
        os.unlink(part)
        return True
    except Exception:  # noqa: BLE001 - a failing report must not hide the failure itself
        return False


def read(path: str) -> Optional[Dict[str, Any]]:
    """The report at `path`, with only the known keys of the right types; None if there is none
    (or it is not a JSON object)."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(_MAX_BYTES).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    out: Dict[str, Any] = {}
    for key, kind in _KEYS.items():
        value = data.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is int and isinstance(value, bool):
            continue
        if isinstance(value, kind):
            out[key] = value
    return out


_hook_installed = False
_failed = False
#: Buffered file objects: what a teardown flushes when it frees them.
_FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair)


def install_excepthook() -> bool:
    """Under a launcher that asks for reports (``$DISTRIBUTOR_FAILURE_FILE`` is set), chain a
    ``sys.excepthook`` that first writes the uncaught exception's report (`write`), then prints it
    as the previous hook did, and register `_teardown_after_failure`. Once per process; True if
    installed by this call."""
    global _hook_installed
    if _hook_installed or not os.environ.get(FAILURE_FILE_VAR):
        return False
    previous = sys.excepthook

    def report_then_print(exc_type: Any, exc: BaseException, tb: Any) -> None:
        global _failed
        write(exc)
        previous(exc_type, exc, tb)
        _failed = True

    sys.excepthook = report_then_print
    # atexit runs the last registered first: this runs after the handlers registered later
    # (e.g. Horovod's shutdown), before those registered earlier
    atexit.register(_teardown_after_failure)
    _hook_installed = True
    return True


def _teardown_after_failure() -> None:
    """After an uncaught exception, make the interpreter's teardown short: the driver ends the
    job when every failed rank has exited, and a process that imported torch or TensorFlow spends
    about 1 s of CPU in its teardown (3 s for three ranks on two busy cores), mostly in the
    garbage collector's full passes over the libraries' objects.

    Flush every file object still open for writing (the teardown flushes those it frees, and
    finds the ones in reference cycles only with the passes skipped here; CPython can even lose a
    text file's data when the file and its buffer are collected together, bpo-17852), collect
    once (the finalizers of what is garbage now run, as they would have), then move every object
    to the permanent generation (``gc.freeze``), which the teardown's passes skip. Objects are
    still freed by reference counting; what is left undone is the ``__del__`` of objects that only
    become cyclic garbage during the teardown, which CPython does not promise at exit either."""
    if not _failed:
        return
    try:
        # type(), not isinstance(): that would read the ``__class__`` of every object, and a
        # proxy's (torch.distributed.reduce_op) warns when read
        for handle in [obj for obj in gc.get_objects() if issubclass(type(obj), _FILE_TYPES)]:
            try:
                if not handle.closed and handle.writable():
                    handle.flush()
            except Exception:  # noqa: BLE001 - a detached, broken or closed-underneath file
                pass
        gc.collect()
        gc.freeze()
    except Exception:  # noqa: BLE001 - the teardown goes on as it would have
        pass
