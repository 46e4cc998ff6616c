"""The chaos tier: random (seeded) faults in real 3-rank jobs; the driver must name the right
rank, end the job within `harness.EXIT_BOUND` seconds of the fault and leave nothing running.

    pytest tests/chaos                               # the short round CI runs (1 run per case)
    CHAOS_RUNS=50 CHAOS_SEED=7 pytest tests/chaos    # a long round: 50 runs per case

A case is one launcher (``horovodrun``, ``function``: ``horovod.run``, ``mpi``: ``horovodrun
--mpi``) and one fault (``kill``, ``raise``, ``close``); see `harness` for what is injected and
what is right. Every run prints one line (seed, fault, target rank, named rank, seconds from the
fault to the driver's exit); ``python tests/chaos/harness.py LAUNCHER FAULT SEED`` reruns one.
"""
from __future__ import annotations

import os
import sys

import pytest

from . import harness

RUNS = int(os.environ.get("CHAOS_RUNS", "1"))
SEED = int(os.environ.get("CHAOS_SEED", "0"))


@pytest.mark.parametrize("fault", harness.FAULTS)
@pytest.mark.parametrize("launcher", harness.LAUNCHERS)
def test_the_driver_names_the_culprit_and_ends_the_job(launcher, fault, tmp_path, capsys):
    if launcher == "mpi" and not harness.mpirun_available():
        pytest.skip("mpirun is not installed")
    failed = []
    for i, seed in enumerate(harness.run_seeds(SEED, launcher, fault, RUNS)):
        out = harness.run(seed, launcher, fault, tmp_path / str(i))
        with capsys.disabled():
            print(f"\n{out.line()}", file=sys.stderr, flush=True)
        if not out.ok:
            failed.append(out)
    assert not failed, "\n\n".join(
        out.line() + "\n" + "\n".join(out.output[-40:]) for out in failed)
