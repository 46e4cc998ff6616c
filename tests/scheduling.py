"""Which worker runs which test files, and in what order (scripts/test.sh: two pytest-xdist workers).

- A file runs whole on one worker, so that its module fixtures (a Spark session, a binding
  program's launch) start once.
- Files that share an expensive resource form one group, run one after another on one worker:
  the multi-host tier (its session fixture brings up the machine's one set of simulated hosts),
  and the files that declare ``pytestmark = pytest.mark.shares("NAME")``, such as the Spark files
  that take the same parked session from tests/distributor/spark_clusters.py (the second file of
  the group finds it running instead of starting its JVMs again).
- The groups start costliest first (longest processing time first, which keeps the two workers'
  ends close): a file's cost is its worker-seconds in tests/file_durations.json, written from a
  time table by ``python tests/timetable.py durations test-times.md > tests/file_durations.json``;
  a file that is not there counts as ``UNKNOWN_COST``. (xdist's own order, most tests first, let a
  500 s file of 7 tests start last and keep one worker busy alone at the end.) The order only
  changes when work starts, never what runs; a stale file costs time, not correctness.

The order is set on the collection (``order``, from ``pytest_collection_modifyitems``), which
every worker collects alike, and xdist hands the groups out in that order (``ByGroup``).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Dict, List

TESTS = Path(__file__).resolve().parent
DURATIONS = TESTS / "file_durations.json"
UNKNOWN_COST = 10.0
MULTIHOST = "tests/multihost"
_SHARES = re.compile(r"""pytest\.mark\.shares\(\s*["']([^"']+)["']""")


@functools.lru_cache(maxsize=None)
def group_of(path: str) -> str:
    """The group of the test file at `path` (relative to the repository, as in node ids)."""
    if path.startswith(MULTIHOST + "/"):
        return MULTIHOST
    try:
        found = _SHARES.search((TESTS.parent / path).read_text())
    except OSError:
        return path
    return f"shares:{found.group(1)}" if found else path


@functools.lru_cache(maxsize=None)
def _durations() -> Dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def order(items: List) -> None:
    """Sorts `items` in place: groups costliest first, files of a group and tests of a file in
    their collected order."""
    costs: Dict[str, float] = {}
    files: Dict[str, None] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path not in files:
            files[path] = None
            group = group_of(path)
            costs[group] = costs.get(group, 0.0) + _durations().get(path, UNKNOWN_COST)
    first_seen = {path: i for i, path in enumerate(files)}
    items.sort(key=lambda item: _key(item.nodeid.split("::", 1)[0], costs, first_seen))


def _key(path: str, costs: Dict[str, float], first_seen: Dict[str, int]) -> tuple:
    group = group_of(path)
    return -costs[group], group, first_seen[path]


def make_scheduler(config, log):
    """xdist's scope scheduler with one scope per group, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # (`--no-loadscope-reorder`: keep `order`'s order)

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid.split("::", 1)[0])

    return ByGroup(config, log)
