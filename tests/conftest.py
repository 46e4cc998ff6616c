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


def pytest_collection_modifyitems(config, items):
    """scripts/test.sh runs the suite on two pytest-xdist workers (``--dist loadgroup``): each test
    file is one group, so it runs whole on one worker and its module fixtures (a Spark cluster, a
    binding program's run) start once; the multi-host tier is one group, because its session
    fixture brings up one set of network namespaces for the whole run."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            parts = item.nodeid.split("::", 1)[0].split("/")
            group = "tests/multihost" if parts[:2] == ["tests", "multihost"] else "/".join(parts)
            item.add_marker(pytest.mark.xdist_group(group))
