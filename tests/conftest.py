"""Suite-wide checks: no test may leave a process it started behind."""
from __future__ import annotations

import os
import time

import pytest


def child_pids(parent: int) -> list[int]:
    """PIDs whose parent is `parent` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = set(child_pids(os.getpid()))
    yield
    deadline = time.monotonic() + 10
    while True:
        left = set(child_pids(os.getpid())) - before
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"test left child processes behind: {sorted(left)}"


def pytest_xdist_make_scheduler(config, log):
    """scripts/test.sh runs the suite on two pytest-xdist workers with ``--dist loadfile``: each
    test file runs whole on one worker, so that its module fixtures (a Spark cluster, a binding
    program's run) start once. Here the multi-host tier counts as one file: its session fixture
    brings up one set of network namespaces for the whole run, which a second worker must not
    bring up beside it. (``--dist loadgroup`` with markers would say the same, but pytest 9 ignores
    the node ids it rewrites.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/multihost" if path.startswith("tests/multihost/") else path

    return ByFile(config, log)
