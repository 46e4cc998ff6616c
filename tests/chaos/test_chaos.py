"""The chaos tier: random (seeded) faults in real 3-rank jobs; the driver must name the right
rank, end the job within `harness.exit_bound` seconds of the fault and leave nothing running;
an elastic job must instead go on and finish with every committed sample counted exactly once.

    pytest tests/chaos                               # the short round CI runs
    CHAOS_RUNS=50 CHAOS_SEED=7 pytest tests/chaos    # a long round: 50 runs of every case

A case is one launcher and one fault (`harness.CASES`): the fixed-size launchers ``horovodrun``,
``function`` (``horovod.run``), ``mpi`` (``horovodrun --mpi``) with ``kill``, ``raise``,
``close`` and ``stop``; the Spark launchers on one local Spark session for the module --
``spark`` (``horovod.spark.run``) and ``runner`` (``HorovodRunner(np=3)``) with ``kill``,
``raise``, ``stop`` and ``worker`` (the rank's Spark Python worker lost), ``distributor``
(``TorchDistributor(local_mode=False)``, plain torch.distributed) with ``kill``, ``raise`` and
``worker``; ``elastic`` (``horovodrun --min-np 2 --max-np 3``
with a discovery script) with ``kill``, ``raise``, ``stop``, ``broadcast`` (a death in the first
state sync, another rank late to it), ``init`` (then a second death inside the next round's
``hvd.init()``), ``stuck`` (as ``init``, and a third worker's set-up of that round never ends: it
must exit and be replaced), ``resets`` (6 deaths in a row: the survivors' memory stays flat across their
resets), and deaths at a phase: ``start`` (in the first round's ``hvd.init()``), ``commit`` (inside
``state.commit()``), ``last`` (in the last step) and ``joining`` (a replacement, in the
``hvd.init()`` of the round it joins). See `harness` for what is injected and what
is right. Every run prints one line (seed, fault, target rank, named rank, seconds from the fault
to the driver's exit); ``python tests/chaos/harness.py LAUNCHER FAULT SEED`` reruns one.

Phase faults (`harness.run_phase`): a rank of a fixed-size job strikes itself (``kill``, ``raise``,
``stop``) at a phase it reaches -- ``init``, ``broadcast``, ``checkpoint``, ``last``, ``shutdown`` --
under ``horovodrun`` (shared memory), ``tcp`` (``horovodrun``, shared memory off), ``function``,
``mpi``, ``spark``, ``runner`` and ``distributor`` (no ``stop``); ``python tests/chaos/harness.py LAUNCHER FAULT SEED --phase PHASE`` reruns one.

The short round (``CHAOS_RUNS`` unset or 1, CI's form, about 3 minutes) runs one run of each case
in `SHORT_ROUND` and `PHASE_SHORT_ROUND`, and skips the others, saying so: mid-step, a closed
connection under ``horovodrun``, a raise under ``horovod.run`` and a lost Python worker under
``horovod.spark.run`` (a SIGKILL under ``mpi`` is the long round's: the phase faults kill an ``mpi``
rank at the last step); the elastic job's two issue-41 reproducers
(``broadcast`` with rank 1 late, the hang; ``init``, the lost commit) and a death while a
replacement joins; and the phase faults, which between them hit every phase, fault and launcher.
A long round runs every case ``CHAOS_RUNS`` times, every target chosen by the seed. The lost host is in
tests/multihost/test_chaos_hosts.py.
"""
from __future__ import annotations

import os

import pytest

from . import harness

RUNS = int(os.environ.get("CHAOS_RUNS", "1"))
SEED = int(os.environ.get("CHAOS_SEED", "0"))
LONG = RUNS > 1
pytestmark = pytest.mark.timeout(harness.round_timeout(RUNS))
#: The short round's cases, each with what it overrides of its seed's choice.
SHORT_ROUND = {
    ("horovodrun", "close"): {},
    ("function", "raise"): {},
    ("elastic", "broadcast"): {"target": 2},  # rank 1 is late: it waits on rank 0, gone
    ("elastic", "init"): {},
    ("elastic", "joining"): {},
    ("spark", "worker"): {},
}
#: The short round's phase faults, (phase, fault, launcher). With `SHORT_ROUND` (mid-step) they
#: hit every phase, every fault (SIGKILL, a raise, SIGSTOP, a closed connection, a lost Python
#: worker) and every launcher at least once. A stop in hvd.init() (no peer beat covers it yet) ends
#: the job on the driver's silence bound (liveness.driver_heartbeat_timeout).
PHASE_SHORT_ROUND = (("init", "stop", "horovodrun"), ("broadcast", "kill", "tcp"),
                     ("checkpoint", "raise", "function"), ("last", "kill", "mpi"),
                     ("checkpoint", "kill", "spark"), ("init", "raise", "runner"),
                     ("shutdown", "kill", "distributor"))
_LONG_ONLY = "the long round's (CHAOS_RUNS=N > 1 runs every case); the short round keeps CI short"


def test_the_short_round_hits_every_phase_fault_and_launcher():
    """Issue 41's CI form: every phase (mid-step being SHORT_ROUND's), every fault and every
    launcher at least once between the two tables."""
    mid_step = [(launcher, fault) for launcher, fault in SHORT_ROUND if launcher != "elastic"]
    assert {phase for phase, _, _ in PHASE_SHORT_ROUND} == set(harness.PHASES) and mid_step
    faults = {fault for _, fault in mid_step} | {fault for _, fault, _ in PHASE_SHORT_ROUND}
    assert faults >= set(harness.FAULTS) | set(harness.PHASE_FAULTS) | set(harness.SPARK_FAULTS)
    launchers = {launcher for launcher, _ in SHORT_ROUND} | {launcher for _, _, launcher in PHASE_SHORT_ROUND}
    assert launchers >= set(harness.LAUNCHERS) | set(harness.PHASE_LAUNCHERS) | {"elastic"}
    for launcher, fault in SHORT_ROUND:
        assert fault in harness.CASES[launcher], (launcher, fault)
    for phase, fault, launcher in PHASE_SHORT_ROUND:
        assert fault in harness.phase_faults(launcher), (phase, fault, launcher)


def test_a_long_round_gives_each_of_its_runs_the_bound_of_one():
    """A test runs its case RUNS times, each run bounded by harness.RUN_TIMEOUT: pytest-timeout's
    bound must grow with the round (the suite's 300 s cut the long round's `stuck` and `resets`)."""
    assert harness.round_timeout(1) == 300
    assert harness.round_timeout(10) >= 10 * harness.RUN_TIMEOUT
    assert pytestmark.name == "timeout" and pytestmark.args == (harness.round_timeout(RUNS),)


def _cases(*launchers: str) -> list:
    """(launcher, fault) of every case of `launchers`, those not in the short round marked to
    skip unless the round is long."""
    return [pytest.param(launcher, fault, marks=pytest.mark.skipif(
        not LONG and (launcher, fault) not in SHORT_ROUND, reason=_LONG_ONLY))
        for launcher in launchers for fault in harness.CASES[launcher]]


def _round(launcher, fault, tmp_path, capsys, **given):
    """This case's runs: RUNS seeded ones, or the short round's one with its overrides."""
    overrides = {} if LONG else SHORT_ROUND[(launcher, fault)]
    harness.check_round((harness.run(seed, launcher, fault, tmp_path / str(i), **overrides, **given)
                         for i, seed in enumerate(harness.run_seeds(SEED, launcher, fault, RUNS))),
                        capsys)


@pytest.mark.parametrize("fault", harness.FAULTS)
@pytest.mark.parametrize("launcher", harness.LAUNCHERS)
def test_the_driver_names_the_culprit_and_ends_the_job(launcher, fault, tmp_path, capsys):
    if launcher == "mpi" and not harness.mpirun_available():
        pytest.skip("mpirun is not installed")
    if not LONG and (launcher, fault) not in SHORT_ROUND:
        pytest.skip(_LONG_ONLY)
    _round(launcher, fault, tmp_path, capsys)


@pytest.mark.parametrize("launcher,fault", _cases("elastic"))
def test_an_elastic_job_replaces_the_failed_worker_and_commits_every_sample_once(
        launcher, fault, tmp_path, capsys):
    _round(launcher, fault, tmp_path, capsys)


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    with harness.spark_session("test_chaos") as session:
        yield session


@pytest.mark.parametrize("launcher,fault", _cases(*harness.SPARK_LAUNCHERS))
def test_a_spark_launcher_names_the_culprit_and_ends_the_job(spark, launcher, fault, tmp_path,
                                                             capsys):
    _round(launcher, fault, tmp_path, capsys, spark=spark)


def _phase_cases(*launchers: str) -> list:
    return [(phase, fault, launcher) for phase in harness.PHASES for fault in harness.PHASE_FAULTS
            for launcher in launchers if fault in harness.phase_faults(launcher)]


def _phase_round(phase, fault, launcher, tmp_path, capsys, spark=None):
    if launcher == "mpi" and not harness.mpirun_available():
        pytest.skip("mpirun is not installed")
    if not LONG and (phase, fault, launcher) not in PHASE_SHORT_ROUND:
        pytest.skip(_LONG_ONLY)
    seeds = harness.run_seeds(SEED, f"{launcher}@{phase}", fault, RUNS)
    harness.check_round((harness.run(seed, launcher, fault, tmp_path / str(i), spark=spark,
                                     phase=phase)
                         for i, seed in enumerate(seeds)), capsys)


@pytest.mark.parametrize("phase,fault,launcher", _phase_cases(
    *(launcher for launcher in harness.PHASE_LAUNCHERS if launcher not in harness.SPARK_LAUNCHERS)))
def test_a_fault_at_a_phase_names_the_culprit_and_ends_the_job(phase, fault, launcher, tmp_path,
                                                               capsys):
    _phase_round(phase, fault, launcher, tmp_path, capsys)


# (the Spark session is a fixture of the test, set up before it: a test that started it in its
# body would count the session's JVM as a process it left behind)
@pytest.mark.parametrize("phase,fault,launcher", _phase_cases(
    *(launcher for launcher in harness.PHASE_LAUNCHERS if launcher in harness.SPARK_LAUNCHERS)))
def test_a_fault_at_a_phase_under_a_spark_launcher_names_the_culprit_and_ends_the_job(
        spark, phase, fault, launcher, tmp_path, capsys):
    _phase_round(phase, fault, launcher, tmp_path, capsys, spark)
