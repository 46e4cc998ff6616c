"""The randomized soak (soak_program.py) in ONE horovodrun launch per configuration.

2 and 3 ranks, shared memory on and off (off: the TCP mesh that ranks on several hosts use), and
2 ranks on gloo alone (what sets larger than the mesh's limit use).
Every rank checks every result against a value it computes locally; the program prints a
``SOAK SUMMARY`` line per rank (rounds, ops, checks, failures) that the test echoes.

    SOAK_ROUNDS=200 SOAK_SEED=7 .venv/bin/python -m pytest tests/horovod_compat/torch/test_soak.py -s

CI (CI=true) runs a short version (SOAK_ROUNDS defaults to 6 there, 30 otherwise); SOAK_SEED picks
the random stream (default 20260), so a failure is reproduced by re-running with the same seed
and rounds. A hang fails the test at a hard timeout instead of blocking the suite, and the
program's own watchdog prints every thread's stack naming the round and operation first.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hvd_launch import CI, GLOO_ONLY, SHM_OFF, SHM_ON, horovodrun, marked_lines, parse_fields

PROGRAM = Path(__file__).with_name("soak_program.py")
ROUNDS = int(os.environ.get("SOAK_ROUNDS", "6" if CI else "30"))
SEED = int(os.environ.get("SOAK_SEED", "20260"))


ENVS = {"shm-on": SHM_ON, "shm-off": SHM_OFF, "gloo-only": GLOO_ONLY}
CONFIGS = [pytest.param(np, shm, id=f"np{np}-{shm}") for np in (2, 3) for shm in ("shm-on", "shm-off")]
CONFIGS.append(pytest.param(2, "gloo-only", id="np2-gloo-only"))


def _hard_timeout(np: int) -> float:
    return 180 + 25 * ROUNDS * np


@pytest.mark.timeout(_hard_timeout(3) + 60)
@pytest.mark.parametrize("np, shm", CONFIGS)
def test_soak(np, shm):
    env = ENVS[shm]
    hang = 90.0
    run = horovodrun(np, [sys.executable, str(PROGRAM), "--seed", str(SEED), "--rounds", str(ROUNDS),
                          "--reinit-every", str(max(2, ROUNDS // 4)), "--hang-timeout", str(hang)],
                     env=env, timeout=_hard_timeout(np))
    summaries = marked_lines(run.output, "SOAK SUMMARY")
    for line in summaries:
        print(line)
    problems = marked_lines(run.output, "SOAK FAIL", "SOAK ERROR", "SOAK HANG", "Fatal Python error")
    report = (f"soak np={np} {shm} seed={SEED} rounds={ROUNDS}: exit {run.returncode}"
              f"{' (killed at the hard timeout)' if run.timed_out else ''}\n"
              + "\n".join(problems[:40]) + "\n--- last lines ---\n" + run.tail(80))
    assert not run.timed_out, report
    assert len(summaries) == np, report
    fields = [parse_fields(line) for line in summaries]
    assert all(f["completed"] == "yes" for f in fields), report
    assert sum(int(f["failures"]) for f in fields) == 0, report
    assert all(int(f["ops"]) > 0 for f in fields), report
    assert run.returncode == 0, report
