"""`distributor.failure_report`: the typed fields of a failure; `install_excepthook`: the report
of an uncaught exception, and the short teardown after it that keeps every guarantee of the
interpreter's own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from distributor import failure_report
from distributor.failure_report import FAILURE_FILE_VAR

ROOT = Path(__file__).resolve().parents[2]

_PROGRAM = """\
import atexit, gc, os, sys
from distributor import failure_report

# registered before the hook's handler, so it runs after it: what the teardown then starts from
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))
failure_report.install_excepthook()
atexit.register(lambda: print("an atexit handler registered later ran first", flush=True))


class Cycle:
    def __init__(self, path, lines):
        self.me = self                      # freed by the garbage collector only
        self.handle = open(path, "w")       # buffered: nothing on disk before it is flushed
        self.handle.write(lines)

    def __del__(self):
        print("a finalizer of cyclic garbage ran", flush=True)


class Proxy:  # like torch.distributed.reduce_op: reading its __class__ warns
    @property
    def __class__(self):
        print("a proxy's __class__ was read", file=sys.stderr, flush=True)
        return Proxy


proxy = Proxy()
Cycle(sys.argv[1] + ".garbage", "dropped before the failure\\n")  # garbage at once
kept = Cycle(sys.argv[1], "written before the failure\\n")    # reachable when the rank fails
if sys.argv[2] == "raise":
    raise ValueError("the cause")
"""


def _run(tmp_path: Path, how: str, report: bool = True):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(FAILURE_FILE_VAR, None)
    if report:
        env[FAILURE_FILE_VAR] = str(tmp_path / "report.json")
    data = tmp_path / "data.txt"
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, str(data), how], env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, data


def test_an_uncaught_exception_is_reported_printed_and_the_teardown_loses_nothing(tmp_path):
    proc, data = _run(tmp_path, "raise")
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exc_type"] == "ValueError" and report["exc_message"] == "the cause"
    assert "knock_on" not in report  # a ValueError says neither: the driver reads its message
    # the traceback, and nothing after it: the teardown touches no object's Python code
    assert proc.stderr.startswith("Traceback") and proc.stderr.endswith("ValueError: the cause\n")
    out = proc.stdout.splitlines()
    # the handlers registered after the hook ran before it; the one registered before ran after
    # it, with every object frozen: the teardown's garbage-collector passes have nothing to do
    assert out.index("an atexit handler registered later ran first") < out.index("frozen True")
    # what was garbage when the rank failed was collected, its finalizer run, its file flushed
    assert "a finalizer of cyclic garbage ran" in out
    assert (tmp_path / "data.txt.garbage").read_text() == "dropped before the failure\n"
    # a file that only a reference cycle holds is flushed although the cycle is never collected
    assert data.read_text() == "written before the failure\n"


def test_a_program_that_succeeds_keeps_the_interpreters_teardown(tmp_path):
    proc, data = _run(tmp_path, "succeed")
    assert proc.returncode == 0, proc.stderr
    assert "frozen False" in proc.stdout.splitlines()
    assert not (tmp_path / "report.json").exists()
    assert data.read_text() == "written before the failure\n"  # by the teardown's own passes


def test_without_a_launcher_asking_for_reports_nothing_is_installed(tmp_path):
    proc, _ = _run(tmp_path, "raise", report=False)
    assert proc.returncode == 1 and "ValueError: the cause" in proc.stderr
    assert "frozen False" in proc.stdout.splitlines()
    assert not (tmp_path / "report.json").exists()


def test_the_fields_say_what_the_exceptions_say_and_nothing_more():
    """A knock-on (an exception of the chain with ``knock_on`` true) names its peer; an exception
    that says it is a cause (``knock_on`` false, as Horovod's own errors) is one; one that says
    neither (gloo's "Connection closed by peer", a user's ValueError) gets no fields, so that the
    driver reads its message instead of taking it for a cause."""
    class Typed(RuntimeError):
        knock_on = False

    knock_on = Typed("peer gone")
    knock_on.knock_on, knock_on.peer = True, 3
    try:
        try:
            raise knock_on
        except Typed:
            raise ValueError("while handling it")
    except ValueError as exc:
        chained = exc
    assert failure_report.fields(chained) == {"knock_on": True, "peer": 3, "frozen": False}
    assert failure_report.fields(Typed("own")) == {"knock_on": False, "peer": None, "frozen": False}
    gloo = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:5555")
    assert failure_report.fields(gloo) == {}
    assert "knock_on" not in failure_report.report(gloo)
