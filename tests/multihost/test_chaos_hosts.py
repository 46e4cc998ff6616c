"""The chaos tier's lost host (docs/failures.md, "The chaos tier"): a 3-rank job of the chaos
training program across the two simulated hosts (ranks 0 and 1 on hc1, rank 2 on hc2), one of
which is lost at a random (seeded) step: the link of its network namespace is set down on the
bridge side, so it stops answering without closing anything, as a host that loses power or
its network does.

Right: the job ends within ``harness.exit_bound("lost")`` (FROZEN_SECONDS + LOST_MARGIN) seconds of
the loss (the others notice the lost ranks' silence after HOROVOD_COMPAT_FROZEN_SECONDS), with a non-zero
exit status, naming a rank on the lost host; nothing of the job is left on this machine or on the
host that stayed; the lost host's ranks end by themselves while it is still cut off (they too
see their peers fall silent). What the launcher runs on the lost host besides the ranks (sshd
sessions, mpirun's daemon) can only end once the host is back: the test then brings the link up
and checks that they go within ``BACK_SECONDS``.

Launchers: ``mpi`` (horovodrun -H's default across hosts: mpirun over ssh) and ``gloo``
(``--gloo``: each rank over ssh). The short round (CI) runs one job; ``CHAOS_RUNS=N`` runs N per
launcher (seeds from ``CHAOS_SEED``).
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import List

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "chaos"))
import harness  # noqa: E402

RUNS = int(os.environ.get("CHAOS_RUNS", "1"))
pytestmark = pytest.mark.timeout(harness.round_timeout(RUNS))
SEED = int(os.environ.get("CHAOS_SEED", "0"))
LAUNCHERS = ("mpi", "gloo")
#: Seconds the lost host's launcher processes may take to end once its link is back up.
BACK_SECONDS = float(os.environ.get("CHAOS_BACK_SECONDS", "60"))


def lost_plan(seed: int) -> tuple:
    """(index of the host lost, step at which it is lost) that `seed` injects."""
    rng = random.Random(seed)
    return rng.randrange(2), rng.randint(2, 25)


def _link(index: int, state: str) -> None:
    """Set the bridge side of host `index`'s link up or down (scripts/cluster.sh names it hcvN)."""
    subprocess.run(["ip", "link", "set", f"hcv{index + 1}", state], check=True, timeout=30)


def _pythons_on(cluster, name: str) -> List[int]:
    """The Python processes on host `name` (ranks, and the rank entry points that run them)."""
    return [pid for pid, command in cluster.commands(name).items()
            if os.path.basename(command.split(" ", 1)[0]).startswith("python")]


def run_lost_host(seed: int, launcher: str, cluster, workdir: Path) -> harness.Outcome:
    lost, step = lost_plan(seed)
    lost_ranks = {0, 1} if lost == 0 else {2}
    (lost_name, _), (kept_name, _) = cluster.hosts[lost], cluster.hosts[1 - lost]
    out = harness.Outcome(seed, f"hosts-{launcher}", "lost", min(lost_ranks), step)
    marker = uuid.uuid4().hex
    env = harness._env(marker, CHAOS_STEPS="400")
    a, b = cluster.addresses
    argv = [*harness.horovodrun(), "-np", "3", "-H", f"{a}:2,{b}:1",
            *(["--gloo"] if launcher == "gloo" else []), sys.executable, str(harness.PROGRAM)]
    fault_at: List[float] = []

    def on_line(line: str) -> None:
        m = harness._STEP.search(line)
        if m and not fault_at and int(m.group(1)) >= step:
            fault_at.append(time.time())
            _link(lost, "down")
        m = harness._NAMED.match(line)
        if m and out.named is None:
            out.named, out.failure_line = int(m.group(1)), line

    workdir.mkdir(parents=True, exist_ok=True)
    try:
        exited_at = harness._run_process(argv, env, workdir, out, on_line)
        problems = out.problems
        if not fault_at:
            problems.append("the host was never lost (did the job start?)")
        else:
            out.seconds = exited_at - fault_at[0]
            bound = harness.exit_bound("lost")
            if out.seconds > bound:
                problems.append(f"exited {out.seconds:.2f}s after the loss (bound {bound:g}s)")
        if out.returncode == 0:
            problems.append("exit status 0")
        if out.named is None:
            problems.append("the driver named no rank")
        elif out.named not in lost_ranks:
            problems.append(f"named rank {out.named}, not one on the lost host {sorted(lost_ranks)}")
        harness._check_left(out, lambda: harness.processes_with(marker))
        harness._check_left(out, lambda: cluster.processes(kept_name))
        # the lost host's ranks see their peers fall silent too, and end while it is cut off
        deadline = time.monotonic() + harness.exit_bound("stop")
        while _pythons_on(cluster, lost_name) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pythons_on(cluster, lost_name):
            problems.append(f"ranks still running on the lost host {lost_name}: "
                            f"{cluster.commands(lost_name)}")
    finally:
        if fault_at:
            _link(lost, "up")
    back = time.monotonic()
    while cluster.processes(lost_name) and time.monotonic() - back < BACK_SECONDS:
        time.sleep(0.2)
    left = cluster.commands(lost_name)
    out.notes.append(f"lost={lost_name} back_gone={time.monotonic() - back:.1f}")
    if left:
        out.problems.append(f"left on {lost_name} {BACK_SECONDS:g}s after it came back: {left}")
        cluster.kill_all(lost_name)
    return out


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_lost_host_ends_the_job_naming_one_of_its_ranks(cluster, launcher, tmp_path, capsys):
    runs = RUNS if RUNS > 1 else (1 if launcher == "mpi" else 0)
    if not runs:
        pytest.skip("the short round loses a host once (launcher mpi); CHAOS_RUNS=N runs both")
    harness.check_round((run_lost_host(seed, launcher, cluster, tmp_path / str(i))
                         for i, seed in enumerate(harness.run_seeds(SEED, f"hosts-{launcher}",
                                                                    "lost", runs))), capsys)
