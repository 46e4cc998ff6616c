"""The suite's time table: what each test and each file costs (``--time-table PATH``).

``bash scripts/test.sh --time-table times.md`` writes, when the run ends, a Markdown table of
every file and every test, costliest first, and prints the ten costliest files.  Per test
(setup, call and teardown together, so a module fixture's start counts in its file's first test):

- **wall**: seconds the test held its worker;
- **cpu**: CPU seconds of the worker and of every child it waited for (``getrusage``: ranks,
  launchers, JVMs that exit with the job); a daemon that outlives its parent is not counted;
- **procs**: processes started on the whole machine while the test ran (the kernel's fork counter
  in ``/proc/stat``).  With two workers this includes what the other worker started meanwhile, so
  it is exact only with ``HOROVOD_COMPAT_TEST_WORKERS=0``.

Per file, ``worker-s`` is the sum of its tests' wall (what it costs a worker), ``span`` the time
from its first test's start to its last test's end.  The workers measure; the controller (or the
single process) collects the figures from the reports and writes the table, with how busy the machine's cores were over the run (a
low figure means the workers mostly waited: on sleeps, timeouts, other processes).
"""
from __future__ import annotations

import os
import resource
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_PROPERTY = "horovod_compat_time"
_phase_start = pytest.StashKey[tuple]()


def _forks() -> int:
    """The machine's count of processes started since boot."""
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("processes "):
                return int(line.split()[1])
    return 0


def _machine_cpu() -> tuple:
    """(busy, all) CPU ticks of the whole machine since boot (/proc/stat's first line)."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _snapshot() -> tuple:
    return time.time(), _cpu(), _forks()


@dataclass
class _Row:
    start: float = float("inf")
    end: float = 0.0
    wall: float = 0.0
    cpu: float = 0.0
    procs: int = 0
    tests: int = 0
    outcomes: set = field(default_factory=set)

    def add(self, start: float, wall: float, cpu: float, procs: int) -> None:
        self.start = min(self.start, start)
        self.end = max(self.end, start + wall)
        self.wall += wall
        self.cpu += cpu
        self.procs += procs


def pytest_addoption(parser):
    parser.addoption("--time-table", metavar="PATH", default=None,
                     help="write a Markdown table of each file's and each test's wall-clock, CPU "
                          "and processes started to PATH (tests/timetable.py)")


class TimeTable:
    """Measures each phase of each test (in the process that runs it) and, where the reports
    arrive, adds them up per test and per file."""

    def __init__(self, path: str):
        self.path = path
        self.tests: dict[str, _Row] = defaultdict(_Row)
        self.started = time.time()
        self.machine = _machine_cpu()

    # -- measuring, where the test runs
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        item.stash[_phase_start] = _snapshot()
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        item.stash[_phase_start] = _snapshot()
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item):
        item.stash[_phase_start] = _snapshot()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        begun = item.stash.get(_phase_start, None)
        if begun is not None:
            now = _snapshot()
            report.user_properties.append(
                (_PROPERTY, (begun[0], now[0] - begun[0], now[1] - begun[1], now[2] - begun[2])))
        return report

    # -- collecting, where the reports arrive (the controller under xdist)
    def pytest_runtest_logreport(self, report):
        for name, value in report.user_properties:
            if name == _PROPERTY:
                row = self.tests[report.nodeid]
                row.add(*value)
                if report.when == "call" or report.outcome != "passed":
                    row.outcomes.add(report.outcome)

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
            return
        files: dict[str, _Row] = defaultdict(_Row)
        for nodeid, row in self.tests.items():
            f = files[nodeid.split("::", 1)[0]]
            f.add(row.start, row.wall, row.cpu, row.procs)
            f.end = max(f.end, row.end)
            f.tests += 1
        total = _Row()
        for row in files.values():
            total.add(row.start, row.wall, row.cpu, row.procs)
        elapsed = time.time() - self.started
        busy, ticks = (now - then for now, then in zip(_machine_cpu(), self.machine))
        lines = [
            "# Test suite time table", "",
            f"Run: {len(self.tests)} tests in {len(files)} files, {elapsed:.0f} s of pytest "
            f"(collection included); {total.wall:.0f} worker-s, {total.cpu:.0f} CPU-s. "
            f"The machine's {os.cpu_count()} cores were busy {100 * busy / max(ticks, 1):.0f}% of "
            f"the run (everything on the machine). Columns: tests/timetable.py.", "",
            "## Files", "",
            "| file | tests | worker-s | span s | cpu s | procs |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name, row in sorted(files.items(), key=lambda kv: -kv[1].wall):
            lines.append(f"| {name} | {row.tests} | {row.wall:.1f} | {row.end - row.start:.1f} | "
                         f"{row.cpu:.1f} | {row.procs} |")
        lines += ["", "## Tests", "", "| test | outcome | wall s | cpu s | procs |",
                  "| --- | --- | --- | --- | --- |"]
        for name, row in sorted(self.tests.items(), key=lambda kv: -kv[1].wall):
            lines.append(f"| {name} | {','.join(sorted(row.outcomes))} | {row.wall:.2f} | "
                         f"{row.cpu:.2f} | {row.procs} |")
        with open(self.path, "w") as out:
            out.write("\n".join(lines) + "\n")
        self.files = files

    def pytest_terminal_summary(self, terminalreporter):
        files = getattr(self, "files", None)
        if not files:
            return
        terminalreporter.section("time table")
        terminalreporter.write_line(f"written to {os.path.abspath(self.path)}; the costliest files:")
        for name, row in sorted(files.items(), key=lambda kv: -kv[1].wall)[:10]:
            terminalreporter.write_line(f"{row.wall:8.1f} worker-s {row.cpu:8.1f} cpu-s "
                                        f"{row.procs:6d} procs  {name}")


def configure(config) -> None:
    """Registers the table when ``--time-table`` is given (from tests/conftest.py)."""
    path = config.getoption("--time-table")
    if path:
        config.pluginmanager.register(TimeTable(path), "horovod_compat_time_table")


def durations(table: str) -> dict:
    """{file: worker-seconds} from a time table's Files section (tests/scheduling.py's costs)."""
    found = {}
    in_files = False
    for line in Path(table).read_text().splitlines():
        if line.startswith("## "):
            in_files = line == "## Files"
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if in_files and len(cells) == 6 and cells[0].startswith("tests/"):
            found[cells[0]] = round(float(cells[2]), 1)
    return found


if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "durations":
        sys.exit("usage: python tests/timetable.py durations TIME_TABLE.md > tests/file_durations.json")
    print(json.dumps(durations(sys.argv[2]), indent=1, sort_keys=True))
