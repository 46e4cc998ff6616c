"""Horovod's own test_torch.py, the whole file in ONE torchrun launch on 2 ranks, as users run it.

Runs scripts/upstream_conformance.sh (LAUNCHER=torchrun) with shared memory on, and with it off
(HOROVOD_COMPAT_SHM_DATA=0 HOROVOD_COMPAT_SHM_CONTROL=0: the TCP-mesh path of ranks on several
hosts).
Every rank must pass at least 102 tests (real Horovod 0.28.1 passes 102 of the 115 here; see the
script's header) with no rank dying and no hang; a shortfall made only of wall-clock tests
(WALL_CLOCK_TESTS) passes when each of them passes on its own in a second launch. The upstream files are not in this repository:
the test skips, saying so, when ../shared/upstream/horovod-0.28.1 (or $HOROVOD_UPSTREAM_DIR) is
absent.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_launch import SHM_OFF, SHM_ON
from tiers import CI  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = Path(os.environ.get("HOROVOD_UPSTREAM_DIR", ROOT.parent / "shared" / "upstream" / "horovod-0.28.1"))
TEST_FILE = UPSTREAM / "test" / "parallel" / "test_torch.py"
MIN_PASSED = 102
LAUNCH_TIMEOUT = 1500
# Stop a rank's pytest after this many failures: real Horovod fails 3 here, and once ranks fall out
# of step every later test waits for a collective timeout, which would hold the suite for an hour.
MAX_FAIL = 6
# Upstream tests whose assertion is a wall-clock bound. test_global_barrier_op: rank 0 sleeps 5 s
# before hvd.barrier() and every rank asserts that >= 5 s passed since IT left the allreduce before;
# rank 1 leaves that allreduce up to a millisecond after rank 0 and its measured margin is ~1 ms, so
# a rank descheduled for a few ms on a loaded 2-core CI box reads 4.99 s (CI hit this once, with the
# barrier correct). When the whole-file launch falls short ONLY by such tests, they run again on
# their own in a second launch and must pass there on both ranks; the whole-file figure is printed
# as measured.
WALL_CLOCK_TESTS = ("test_global_barrier_op",)
@pytest.mark.skipif(not TEST_FILE.is_file(),
                    reason=f"Horovod's upstream test file is not here ({TEST_FILE}); it is not part of this "
                           "repository: set HOROVOD_UPSTREAM_DIR to a Horovod 0.28.1 checkout to run it")
@pytest.mark.timeout(LAUNCH_TIMEOUT + 120)
@pytest.mark.parametrize("shm", ["shm-on", pytest.param("shm-off", marks=pytest.mark.skipif(
    CI, reason="CI runs the file once, with shared memory (the default); "
    "the mesh and gloo paths have their own tests in CI: run without CI=true for both"))])
def test_whole_upstream_file_in_one_torchrun_launch(shm, tmp_path):
    env = dict(os.environ, LAUNCHER="torchrun", REPEAT="1", PYTHON=sys.executable,
               LAUNCH_TIMEOUT=str(LAUNCH_TIMEOUT), **(SHM_OFF if shm == "shm-off" else SHM_ON))
    launch, summary, report = _launch(env, f"--maxfail={MAX_FAIL}", tmp_path / "whole-file", shm)
    assert launch.group(7) == "-", summary + "\n" + report
    passed = (int(launch.group(1)), int(launch.group(4)))
    if min(passed) >= MIN_PASSED:
        return
    clock_failures = {name for name in WALL_CLOCK_TESTS if re.search(rf"failed: {name}$", report, re.M)}
    assert clock_failures and min(passed) + len(clock_failures) >= MIN_PASSED, summary + "\n" + report
    for name in sorted(clock_failures):
        again, again_summary, again_report = _launch(env, f"-k {name}", tmp_path / name, f"{shm} {name} alone")
        assert (again.group(1), again.group(4), again.group(7)) == ("1", "1", "-"), (
            f"{summary}\n{name} failed again on its own, so not (only) from the clock on a loaded "
            f"machine:\n{again_summary}\n{again_report}")


def _launch(env, pytest_args, out, label):
    """One launch of upstream_conformance.sh on TEST_FILE; returns its LAUNCH line's match, a
    one-line summary and the whole report."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "upstream_conformance.sh"), str(TEST_FILE),
                           str(out)], env=dict(env, PYTEST_ARGS=pytest_args), capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT + 60)
    print(proc.stdout)
    launch = re.search(r"^LAUNCH 1 rank0=(\d+)/(\d+)/(\d+) rank1=(\d+)/(\d+)/(\d+) crash=(\S+) exit=(\d+) "
                       r"seconds=(\d+)$", proc.stdout, re.M)
    report = (f"{label}: upstream_conformance.sh exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
              f"\nlogs: {out}")
    assert launch, report
    failed = sorted(set(re.findall(r"^  rank\d failed: (\S+)", proc.stdout, re.M)))
    summary = (f"{label}: passed {launch.group(1)}/{launch.group(4)} (rank 0/1), crash/hang: "
               f"{launch.group(7)}, {launch.group(9)} s; failed tests: {', '.join(failed) or 'none'}")
    print(summary)
    return launch, summary, report
