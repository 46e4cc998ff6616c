"""Entry point of every rank process: `python -m distributor.rank_entry`.

It proves the job secret to the driver hub, receives its target, runs it with the torchrun
environment already in place, and reports the outcome: the pickled return value, or the
exception with its traceback. It dies with its parent and when the driver goes away, so a killed
driver leaves no rank behind.
"""
from __future__ import annotations

import atexit
import builtins
import ctypes
import faulthandler
import glob
import importlib.machinery
import os
import pickle
import runpy
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
import zipfile
from typing import Any, Callable, Optional, Sequence

from . import failure_report, netif, procfs, protocol, worker
from .payload import dumps_value, loads_target
from .protocol import Channel, Kind, PayloadFlag, split_payload
from .rank_env import (
    HUB_ADDRESS_VAR,
    PARENT_PID_VAR,
    PRIVATE_VARS,
    RANK_VAR,
    SECRET_VAR,
    from_mpi_environment,
)

#: Seconds between two heartbeats of a rank to the driver (from a thread of its own: a stopped
#: process, or native code that holds the GIL, stops them; `LaunchRequest.heartbeat_timeout`).
HEARTBEAT_INTERVAL = 1.0
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: rely on the hub-connection watchdog alone
    expected = os.environ.get(PARENT_PID_VAR)
    if expected and os.getppid() != int(expected):
        os._exit(70)


def raise_open_file_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit, as many launchers do
    (torch's gloo keeps every connection a stranger makes to its listener open until the job
    ends: under a soft limit of 1024, a flood of them aborts the rank with "Too many open files").
    The command a rank runs inherits it."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        # an unlimited hard limit: Linux refuses "unlimited" open files; 2**20 is its nr_open
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass  # the hard limit is above what the kernel allows: keep the soft one


def _kill_self() -> None:
    """End this rank and any children it started (it leads its own process group)."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _holds_process_group() -> bool:
    """Whether this process holds torch.distributed's default process group (never imports torch).

    A rank that returns right after `init_process_group` may do so before its peers have made
    their connections to it; a peer then fails with gloo's "Connection closed by peer" or, when
    the store rank 0 serves has gone, "Connection reset by peer"."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and dist.is_available() and dist.is_initialized()
    except Exception:  # noqa: BLE001 - a torch in an odd state holds nothing we can keep
        return False


class _DriverLink:
    """The rank's connection to the hub: heartbeats out, STOP or a lost driver ends the rank
    (after its result: `released`, it may exit)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.finished = threading.Event()  # its result or error sent: no more heartbeats
        # Its target has returned: a STOP from here on releases it (the driver sends one once every
        # rank has finished, maybe before `finished` is set here); killing it would skip its
        # atexit handlers and the flush of its output.
        self.returned = threading.Event()
        self.released = threading.Event()
        threading.Thread(target=self._watch, name="distributor-watchdog", daemon=True).start()
        threading.Thread(target=self._beat, name="distributor-heartbeat", daemon=True).start()

    def _watch(self) -> None:
        try:
            while True:
                kind, body = self.channel.recv()
                if kind == Kind.STOP:
                    break
                if kind in (Kind.WORLD, Kind.HOSTS_UPDATED, Kind.LOST):
                    worker.deliver(kind, body)
        except (ConnectionError, OSError):
            pass
        worker.link_closed()
        self.released.set()
        if not self.returned.is_set():
            _kill_self()

    def _beat(self) -> None:
        while not self.finished.wait(HEARTBEAT_INTERVAL):
            if _command_stopped():
                continue  # the rank is its command: a stopped one is silent, as this process would be
            try:
                self.channel.send(Kind.HEARTBEAT)
            except OSError:
                return


#: The process of the command this rank runs (`_run_command`), while it runs.
_command: Optional[subprocess.Popen] = None


def _command_stopped() -> bool:
    """Whether this rank's command is stopped (SIGSTOP, a debugger)."""
    child = _command
    return child is not None and child.returncode is None and procfs.stopped(child.pid)


def _run_command(argv: list, on_report: Optional[Callable[[dict], None]] = None) -> None:
    """Run a command as this rank, sharing its stdout/stderr; its exit status becomes ours.

    The command gets ``DISTRIBUTOR_FAILURE_FILE`` (`failure_report`): a report it writes there is
    passed to `on_report` as soon as it appears (the driver learns at once whether the failure is
    a cause or a knock-on, before the command's teardown) and travels with the exit status."""
    path = os.path.join(tempfile.gettempdir(),
                        f"distributor-failure-{os.getpid()}-{secrets.token_hex(6)}.json")
    env = {**os.environ, failure_report.FAILURE_FILE_VAR: path}
    global _command
    child = _command = subprocess.Popen(argv, env=env, preexec_fn=_child_dies_with_us)
    forwarded = []

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    report: Optional[dict] = None
    try:
        while True:
            try:
                code = child.wait(timeout=_REPORT_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                code = None
            if report is None and os.path.exists(path):
                report = failure_report.read(path)
                try:  # now, not at the end: a rank the driver stops never gets there
                    os.unlink(path)
                except OSError:
                    pass
                if report is not None and on_report is not None and code is None:
                    on_report(report)
            if code is not None:
                break
    finally:
        for leftover in (path, *glob.glob(f"{glob.escape(path)}.*.part")):
            try:
                os.unlink(leftover)
            except OSError:
                pass
    if code < 0:
        # stopped from outside (the launcher ending the job) after it reported its own failure:
        # the failure is what it reported, the signal only its end
        raise CommandSignalled(-code, report, stopped=report is not None and -code in forwarded)
    if code:
        raise CommandFailed(code, report)


#: How often a rank running a command looks for the command's failure report.
_REPORT_POLL_SECONDS = 0.05


class CommandFailed(SystemExit):
    """The rank's command exited with status `code`; `report` is the failure report it wrote
    (`failure_report`), if any."""

    def __init__(self, code: int, report: Optional[dict] = None) -> None:
        super().__init__(code)
        self.report = report


class CommandSignalled(CommandFailed):
    """The rank's command was killed by signal `signum`: the rank exits with 128 + `signum`, as a
    shell does, and tells the driver the signal."""

    def __init__(self, signum: int, report: Optional[dict] = None, stopped: bool = False) -> None:
        super().__init__(128 + signum, report)
        self.signum, self.stopped = signum, stopped


def _child_dies_with_us() -> None:
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _run_target(payload: bytes, on_report: Optional[Callable[[dict], None]] = None) -> Any:
    target = loads_target(payload)
    if target[0] == "function":
        _, fn, args, kwargs = target
        return fn(*args, **kwargs)
    if target[0] == "command":
        return _run_command(target[1], on_report)
    _, path, argv = target
    return run_as_main(path, argv)


def run_as_main(path: str, argv: Sequence[str], module: bool = False) -> None:
    """Run the script `path` (with `module`: the module of that name) as ``__main__``, as
    ``python path ARGS`` (``python -m path ARGS``) would: ``sys.argv`` is the script's and its
    directory (the working directory) comes first on ``sys.path``, in place of the working
    directory ``python -m distributor.rank_entry`` put there."""
    first = os.getcwd() if module else os.path.dirname(os.path.abspath(path))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = first
    else:
        sys.path.insert(0, first)
    if module:
        sys.argv = ["-m", *argv]  # runpy puts the module's file first, as python -m does
        runpy.run_module(path, run_name="__main__", alter_sys=True)
        return
    sys.argv = [path, *argv]
    if os.path.isdir(path) or zipfile.is_zipfile(path):  # its __main__.py
        runpy.run_path(path, run_name="__main__")
        return
    # as python runs a file: sys.argv[0] as given, __file__ (and the traceback) absolute; runpy
    # would make both the same
    filename = os.path.abspath(path)
    with open(filename, "rb") as handle:
        code = compile(handle.read(), filename, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=filename, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", filename))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _user_traceback(exc: BaseException) -> str:
    """The exception's traceback without the frames of this module and runpy, nor those of the
    front end's wrappers in between (a frame with a true local ``__tracebackhide__``, as pytest
    marks its own)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in _ENGINE_FILES
                              or tb.tb_frame.f_locals.get("__tracebackhide__")):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


_ENGINE_FILES = frozenset({__file__, runpy.__file__, "<frozen runpy>"})


def _innermost(exc: BaseException) -> Optional[str]:
    """"file:line" where `exc` was raised (the innermost frame), or None."""
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def _error_report(exc: BaseException) -> dict:
    """The driver's report of an exception raised in this process: with the typed fields
    (`failure_report.fields`: cause or knock-on of which rank)."""
    return {
        "exc_type": type(exc).__qualname__,
        "exc_message": str(exc),
        "traceback": _user_traceback(exc),
        "time": time.time(),
        "where": _innermost(exc),  # an elastic job retries one exception at one place only once
        **failure_report.fields(exc),
    }


def main() -> int:
    die_with_parent()
    raise_open_file_limit()
    faulthandler.enable()  # a crash in native code still prints the Python stack
    host, port = os.environ.pop(HUB_ADDRESS_VAR).rsplit(":", 1)
    secret = bytes.fromhex(os.environ.pop(SECRET_VAR))
    if RANK_VAR in os.environ:
        rank = int(os.environ.pop(RANK_VAR))
    else:  # one launcher process started several ranks: MPI tells which one this is
        os.environ.update(from_mpi_environment(os.environ))
        rank = int(os.environ["RANK"])
    for name in PRIVATE_VARS:
        os.environ.pop(name, None)
    os.environ.update(netif.interface_env(os.environ))  # before the user's code picks interfaces

    channel = protocol.connect((host, int(port)), secret)
    channel.send(Kind.HELLO, (rank, os.getpid()))
    kind, body = channel.recv()
    if kind != Kind.PAYLOAD:
        raise RuntimeError(f"driver hub sent {kind.name} instead of the payload")
    link = _DriverLink(channel)
    worker.attach(channel, rank)
    flags, payload = split_payload(body)
    send_result = PayloadFlag.SEND_RESULT in flags

    def early(report: dict) -> None:  # a command's failure report, before the command exits
        try:
            channel.send(Kind.ERROR, {"traceback": None, "where": None, **report})
        except OSError:
            pass  # the driver is gone: the watchdog ends this rank

    exit_code = 0
    try:
        try:
            value = _run_target(payload, early)
        finally:
            link.returned.set()
        data: Optional[bytes] = dumps_value(value, f"The return value of rank {rank}") if send_result else None
    except SystemExit as exc:
        code = exc.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        if exit_code:
            report = {**_error_report(exc), "traceback": None}
            for key in ("knock_on", "peer", "frozen"):  # an exit status alone says neither
                report.pop(key, None)
            if isinstance(code, int):  # a plain exit status says it all
                report.update(exc_type=None, exc_message=None)
            else:
                print(code, file=sys.stderr)
            if isinstance(exc, CommandSignalled):  # the driver says "killed by SIGKILL"
                report["stopped_by" if exc.stopped else "signal"] = exc.signum
            if isinstance(exc, CommandFailed) and exc.report:  # what the command said of it
                report.update(exc.report)
            channel.send(Kind.ERROR, report)
        data = pickle.dumps(None) if send_result else None
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the driver
        report = _error_report(exc)
        sys.stderr.write(report["traceback"])
        channel.send(Kind.ERROR, report)
        exit_code = 1
        data = None
    if exit_code == 0:
        channel.send(Kind.RESULT, data or b"", raw=True)  # empty: done, no value asked for
    link.finished.set()
    if exit_code == 0 and PayloadFlag.HOLD in flags and _holds_process_group():
        # the driver's SIGTERM (another rank failed) releases it too: it exits as it would have
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: link.released.set())
        link.released.wait()
    global _channel
    _channel = channel  # closed by _exit, after the atexit handlers
    return exit_code


#: The hub connection of a rank whose target has ended, kept open until its atexit handlers have
#: run: the driver takes its end for the rank's exit (it then stops the job after a failure, and
#: a failed rank still in a slow handler would be shown killed instead of with its exit status).
_channel: Optional[Channel] = None


def _exit(code: int) -> None:
    """Run atexit handlers and flush, close the hub connection, then leave without the
    interpreter's teardown.

    Native libraries (gloo, NCCL, DDP's reducer) can abort while their static objects are torn
    down after the job already succeeded; `multiprocessing` children exit the same way.
    """
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if _channel is not None:
            try:
                _channel.close()
            except OSError:
                pass
        os._exit(code)


if __name__ == "__main__":
    _exit(main())
