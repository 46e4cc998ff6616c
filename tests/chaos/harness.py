"""The chaos harness: run real 3-rank jobs, inject one fault at a random (seeded) moment into a
random rank, and check what the driver says and does.

**Fixed-size jobs** of `train_program.py`, under the launchers ``LAUNCHERS``: ``horovodrun``
(``horovodrun -np 3 python train_program.py``, the direct launcher), ``function``
(``horovod.run(train_program.main, num_proc=3)``), ``mpi`` (``horovodrun --mpi -np 3 ...``), and
the ``SPARK_LAUNCHERS`` in this process, on a ``local[3]`` Spark session (`spark_session`):
``spark`` (``horovod.spark.run(train_program.main, num_proc=3)``), ``runner``
(``HorovodRunner(np=3)``) and ``distributor`` (``TorchDistributor``, `train_program.torch_main`),
faults ``CASES[launcher]``. Faults (``FAULTS``):

* ``kill``: SIGKILL, from outside, of the process that trains on the target rank, once it printed
  a chosen step. Right: the target rank is named, "killed by SIGKILL".
* ``raise``: the target rank raises ``ChaosError`` at a chosen step. Right: the target rank is
  named, with ``ChaosError``.
* ``close``: at a chosen step the target rank shuts down its TCP connections to one other rank
  (gloo's), as a network fault between the two would. Both ends then fail alike ("Connection
  closed by peer"), and either may fail first: right is one of the two ends of those connections.
* ``stop``: SIGSTOP, from outside, of the process that trains on the target rank, once it printed
  a chosen step (a frozen rank). Right: the target rank is named, "stopped responding".
* ``worker`` (Spark launchers only): SIGKILL, from outside, of the Spark Python worker whose task
  runs the target rank (what it runs goes with it: fork server, ranks, mpirun's daemon), once the
  rank printed a chosen step: an executor's Python worker lost. Right: a rank that ran under that
  worker is named (the target's, or under ``runner`` any rank of the host's first task).

Every fixed-size run must also end within `exit_bound` seconds of the fault (``EXIT_BOUND``, 10 s,
after a crash; ``FROZEN_SECONDS`` + ``STOP_MARGIN`` after a freeze: the jobs run with
``HOROVOD_COMPAT_FROZEN_SECONDS=FROZEN_SECONDS``), with a non-zero exit status (an exception from
``horovod.spark.run``), and leave no process behind: every process of a run carries
``CHAOS_MARKER`` in its environment; under Spark, no rank process (a child of an executor's fork
server) may outlive the run. Nor may a shared-memory segment the run made stay in ``/dev/shm``
(`_check_shm`; every launcher: fixed-size, phase, elastic and Spark runs).

**Elastic jobs** (launcher ``elastic``): ``horovodrun -np 3 --min-np 2 --max-np 3
--host-discovery-script ... python elastic_program.py`` (the script offers ``localhost:3`` all
along), faults ``ELASTIC_FAULTS``: ``kill`` (SIGKILL of the worker that has the target rank, up
to 0.1 s after it printed a chosen step; for one seed in three a second SIGKILL follows *during
the recovery*: the survivor that gets a chosen rank in the new round is killed from its reset
callback's line), ``raise`` (``ChaosError`` once, in a chosen step), ``stop`` (the target SIGSTOPs
itself in a chosen step), and two faults at a phase the program reaches (`elastic_program`):
``broadcast`` (the target dies as the first state sync's transfer starts, and another rank comes
to that transfer late, after the others have reset), ``init`` (the same death, then another
worker dies inside the ``hvd.init()`` of the next round), ``stuck`` (as ``init``, and the third
worker's set-up of that round never ends: it must exit ``STUCK_EXIT_SECONDS`` after the driver
named the lost member, and be replaced) and ``resets`` (the worker that has the
target rank SIGKILLs itself ``RESETS`` times, 8 steps apart: the survivors' resident memory must
stay flat across their resets, ``RESET_RSS_BOUND_MB``), and four deaths at a phase
(`elastic_program`): ``start`` (in the first round's ``hvd.init()``; the replacement must then
join, the job's last round is whole), ``commit`` (inside ``state.commit()``), ``last`` (in the
last step) and ``joining`` (a death in a step, then its replacement's in the ``hvd.init()`` of
the round it joins). Right: the job exits 0; the next step
runs within `exit_bound` of the fault; every sample was counted exactly once in the committed
state (`elastic_program`) and trained by some rank; the driver names each failed worker with its
rank and cause (``ELASTIC_WHAT``), and starts a replacement for it (the discovery script still
offers the slot); nothing is left running. The line also reports the recovery, and how many
replacements joined (one that the job's end overtook is stopped by the driver: docs/failures.md).

**Phase faults** (``run(..., phase=P)``, P one of ``train_program.PHASES``: ``init``, ``broadcast``,
``checkpoint``, ``last``, ``shutdown``): the target rank of a fixed-size job strikes itself with
``kill``, ``raise`` or ``stop`` when it reaches the phase (`train_program`), under the
``PHASE_LAUNCHERS``: those above (the Spark launchers too; ``distributor`` without ``stop``) and
``tcp`` (``horovodrun`` with shared memory off, the TCP mesh of ranks on several hosts). Right is
what is right for the same fault at a step.

``run(seed, launcher, fault, workdir)`` is deterministic in what it injects: the seed picks the
target rank, the step, (for ``kill``/``stop``) a delay inside the step, and the other rank of
``broadcast`` and ``init``.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple
from unittest import mock

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # tests/, for `procs` when run as a script
    sys.path.insert(0, str(HERE.parent))
if str(HERE) not in sys.path:  # tests/chaos/, for `train_program`
    sys.path.insert(0, str(HERE))
if str(HERE.parents[1]) not in sys.path:  # the repository: its `distributor`, not tests/distributor
    sys.path.insert(0, str(HERE.parents[1]))

import procs  # noqa: E402
from distributor import engine  # noqa: E402
from horovod_compat.common import shm_names  # noqa: E402
from horovod_compat.common.liveness import driver_heartbeat_timeout  # noqa: E402
from train_program import CHECKPOINT_EVERY, PHASES  # noqa: E402
PROGRAM = HERE / "train_program.py"
ELASTIC_PROGRAM = HERE / "elastic_program.py"
NP = 3
#: Launchers of fixed-size jobs started as a process of their own (``spark`` runs in this one).
LAUNCHERS = ("horovodrun", "function", "mpi")
FAULTS = ("kill", "raise", "close", "stop")
ELASTIC_FAULTS = ("kill", "raise", "stop", "broadcast", "init", "stuck", "resets", "start",
                  "commit", "last", "joining")
#: How many times the elastic fault ``resets`` strikes in a run.
RESETS = int(os.environ.get("CHAOS_RESETS", "6"))
#: Elastic faults the program injects in itself at a phase it reaches (`elastic_program`), and
#: how the driver must describe the failed worker.
ELASTIC_WHAT = {"kill": "killed by SIGKILL", "raise": "ChaosError", "stop": "stopped responding",
                "resets": "killed by SIGKILL",
                "broadcast": "killed by SIGKILL", "init": "killed by SIGKILL",
                "stuck": "killed by SIGKILL", "start": "killed by SIGKILL",
                "commit": "killed by SIGKILL", "last": "killed by SIGKILL",
                "joining": "killed by SIGKILL"}
#: Fault ``stuck``: seconds the stuck worker's set-up lasts after the driver named the round's
#: lost member, before the runtime makes it exit (``HOROVOD_COMPAT_LOST_ROUND_EXIT_SECONDS``).
STUCK_EXIT_SECONDS = 2.0
SPARK_FAULTS = ("kill", "raise", "stop", "worker")
#: The Spark launchers, each in this process on one Spark session: ``spark``
#: (``horovod.spark.run``), ``runner`` (``HorovodRunner(np=3)``: one mpirun across the tasks) and
#: ``distributor`` (``TorchDistributor(local_mode=False)`` running `train_program.torch_main`,
#: plain torch.distributed: no ``stop``, which only torch's own timeout or the engine's 120 s
#: heartbeat bound would find, as under PySpark's TorchDistributor).
SPARK_LAUNCHERS = ("spark", "runner", "distributor")
#: What each Spark launcher's caller calls.
SPARK_CALLS = {"spark": "horovod.spark.run", "runner": "HorovodRunner.run",
               "distributor": "TorchDistributor.run"}
#: Launchers of the phase faults: ``tcp`` is ``horovodrun`` with shared memory off.
PHASE_LAUNCHERS = ("horovodrun", "tcp", "function", "mpi", "spark", "runner", "distributor")
PHASE_FAULTS = ("kill", "raise", "stop")


def phase_faults(launcher: str) -> Tuple[str, ...]:
    """The phase faults of `launcher`: ``distributor`` has no ``stop`` (see `SPARK_LAUNCHERS`)."""
    return tuple(fault for fault in PHASE_FAULTS if fault in CASES.get(launcher, PHASE_FAULTS))


#: The shared-memory switches of the ``tcp`` launcher (docs/failures.md: the TCP mesh).
SHM_OFF = {"HOROVOD_COMPAT_SHM_DATA": "0", "HOROVOD_COMPAT_SHM_CONTROL": "0"}
#: Every case: launcher -> its faults.
CASES = {**{launcher: FAULTS for launcher in LAUNCHERS}, "spark": SPARK_FAULTS,
         "runner": SPARK_FAULTS, "distributor": ("kill", "raise", "worker"),
         "elastic": ELASTIC_FAULTS}
#: The driver's shortest fallback timer (`distributor.engine`: FAILED_EXIT_SECONDS, how long it
#: waits for a failed rank's exit; DISCONNECT_GRACE_SECONDS, for an exited rank's frames): a job
#: that ends sooner after its fault ended on events alone; one that sat out a timer ends later.
#: The bounds below are built on it, not on how fast a machine is: an idle 2-core machine ends a
#: crashed job 0.2-3.2 s after the fault, a loaded CI one has taken 5 s, and a bound that a loaded
#: machine meets only narrowly makes the tier fail on speed, not on a fault of the driver.
GRACE = min(engine.FAILED_EXIT_SECONDS, engine.DISCONNECT_GRACE_SECONDS)
#: Seconds from a crash (kill, raise, close) to the driver's exit: less than GRACE. A long round
#: on an idle machine may hold the runs to what they take there: ``CHAOS_EXIT_BOUND=5``.
EXIT_BOUND = float(os.environ.get("CHAOS_EXIT_BOUND", str(GRACE)))
#: HOROVOD_COMPAT_FROZEN_SECONDS of every run (the documented default is 30 s; lower keeps runs short).
FROZEN_SECONDS = float(os.environ.get("CHAOS_FROZEN_SECONDS", "5"))
#: Seconds, on top of FROZEN_SECONDS, the job may take to end after a rank is stopped: the
#: launcher's stop of the ranks (about 3 s, docs/failures.md) and a loaded machine's delays, less
#: than GRACE (a driver that sat out a timer after the freeze is noticed takes more).
STOP_MARGIN = float(os.environ.get("CHAOS_STOP_MARGIN", str(GRACE)))
#: Seconds, on top of FROZEN_SECONDS, a job may take to end after a host is lost (tests/multihost/
#: test_chaos_hosts.py): the driver waits KNOCK_ON_SETTLE_SECONDS (3) for the silent ranks to
#: report, stops the launcher (up to 3 s: mpirun waits for its daemon there), then waits
#: DISCONNECT_GRACE_SECONDS (10) for what the lost ranks sent, their connections staying open:
#: about 16 s idle; and a loaded machine's delays, with a wide margin: 40 s, still far below the
#: heartbeat timeout (120 s) that a driver blind to the silence would sit out. (That the graces
#: of the lost ranks run at once, not one after the other, has its own test without processes:
#: tests/distributor/test_engine.py.)
LOST_MARGIN = float(os.environ.get("CHAOS_LOST_MARGIN", "40"))
#: Seconds a whole run may take (start-up included) before it counts as hung.
RUN_TIMEOUT = float(os.environ.get("CHAOS_RUN_TIMEOUT", "120"))


def round_timeout(runs: int) -> float:
    """pytest-timeout's bound for a test that runs a case `runs` times: each run has its own
    bound (RUN_TIMEOUT, and the wait for what it left), so the test's grows with the round. The
    suite's 300 s ended the long round's `stuck` and `resets` cases (10 runs of 30-60 s each)
    though every run was right."""
    return max(300.0, runs * (RUN_TIMEOUT + 30.0))

#: Samples of the elastic program's data set (3 per step with 3 workers).
ELASTIC_SAMPLES = int(os.environ.get("CHAOS_SAMPLES", "360"))
MARKER_VAR = "CHAOS_MARKER"
#: How long after a run's end what it left (processes, /dev/shm segments, listening ports) may
#: still be going: 10 s, as tests/conftest.py gives a test's children, is what a loaded machine's
#: teardown of killed processes meets with a wide margin.
LEFT_SECONDS = 10.0
#: How much a survivor's resident memory may grow from its second reset to its last in a run of
#: repeated resets (elastic fault ``resets``): a leak of a process group, a transport or a state
#: copy per reset shows as several MB each time.
RESET_RSS_BOUND_MB = float(os.environ.get("CHAOS_RESET_RSS_BOUND_MB", "24"))

_PID = re.compile(r"chaos-pid rank=(\d+) (?:size=\d+ )?pid=(\d+)")
_STEP = re.compile(r"step (\d+) rank (\d+) ")
_FAULT = re.compile(r"chaos-fault rank=(\d+) peer=(-?\d+) t=([\d.]+)")
_STUCK = re.compile(r"chaos-stuck rank=(\d+) pid=(\d+)")
_NAMED = re.compile(r"(?:^horovodrun: |^chaos-driver: )Rank (\d+) (.*)$")
_WORKER = re.compile(r"^\[(\d+)\]<stdout>:(.*)$")
_RESET = re.compile(r"chaos-reset rank=(\d+) size=(\d+) pid=(\d+)(?: t=\S+ rss_kb=(\d+))?")
#: The elastic driver's record of a failed worker (``ElasticJob._on_failure``).
_ATTEMPT = re.compile(r"elastic job: worker (\d+) \((?:rank (\d+) of round \d+|not in a round yet)"
                      r", host [^)]*\) (.*) -> (.*)$")

_FUNCTION_DRIVER = """\
import sys
sys.path.insert(0, {here!r})
import horovod
import train_program
try:
    horovod.run(train_program.main, num_proc={np})
except Exception as exc:
    print("chaos-driver: " + str(exc), file=sys.stderr, flush=True)
    sys.exit(1)
"""


def horovodrun() -> List[str]:
    found = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    return [found] if found else [sys.executable, "-m", "horovod_compat.run"]


def mpirun_available() -> bool:
    return bool(shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun"))


@dataclass
class Outcome:
    seed: int
    launcher: str
    fault: str
    target: int
    step: int
    named: Optional[int] = None
    failure_line: str = ""
    peer: Optional[int] = None          # close: the other end of the closed connections
    seconds: Optional[float] = None     # from the fault to the driver's exit
    returncode: Optional[int] = None
    left: List[int] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    output: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # more "key=value" for the line
    lost_with: List[int] = field(default_factory=list)  # worker: the ranks under the worker killed
    phase: str = "step"

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        secs = "-" if self.seconds is None else f"{self.seconds:.2f}"
        verdict = "ok" if self.ok else "FAILED: " + "; ".join(self.problems)
        peer = f" peer={self.peer}" if self.fault == "close" else ""
        notes = "".join(f" {note}" for note in self.notes)
        where = f"step={self.step}" if self.phase == "step" else f"phase={self.phase}"
        return (f"chaos seed={self.seed} launcher={self.launcher} fault={self.fault} "
                f"target={self.target}{peer} {where} named={self.named} "
                f"seconds={secs} rc={self.returncode}{notes} {verdict}")


def exit_bound(fault: str, phase: str = "step") -> float:
    """Seconds from `fault` to the driver's exit that a run may take: EXIT_BOUND after a crash,
    FROZEN_SECONDS + STOP_MARGIN after a freeze (``stop``) -- the driver's silence bound instead of
    FROZEN_SECONDS where no peer waits for the frozen rank (in ``hvd.init()``, at shutdown) --,
    FROZEN_SECONDS + LOST_MARGIN after a lost host (``lost``)."""
    if fault == "stop" and phase in ("init", "shutdown"):
        return driver_heartbeat_timeout({"HOROVOD_COMPAT_FROZEN_SECONDS": f"{FROZEN_SECONDS:g}"}) \
            + STOP_MARGIN
    if fault == "stop":
        return FROZEN_SECONDS + STOP_MARGIN
    if fault == "lost":
        return FROZEN_SECONDS + LOST_MARGIN
    if fault == "stuck":
        return EXIT_BOUND + STUCK_EXIT_SECONDS
    return EXIT_BOUND


def plan(seed: int) -> tuple:
    """(target rank, step, delay) that `seed` injects."""
    rng = random.Random(seed)
    return rng.randrange(NP), rng.randint(2, 25), rng.uniform(0.0, 0.03)


def elastic_plan(seed: int) -> tuple:
    """(target rank, step, second kill during the recovery?, the rank in the new round it hits,
    delay of the first kill after the step's line) that `seed` injects into an elastic job. The
    delay (up to 0.1 s, about two steps) lets the kill land anywhere in a step, also between
    collectives of the survivors' next step, whose first changes the state."""
    rng = random.Random(seed)
    return (rng.randrange(NP), rng.randint(3, 40), rng.random() < 1 / 3, rng.randrange(NP - 1),
            rng.uniform(0.0, 0.1))


def _argv(launcher: str, workdir: Path) -> List[str]:
    if launcher in ("horovodrun", "tcp"):
        return [*horovodrun(), "-np", str(NP), sys.executable, str(PROGRAM)]
    if launcher == "mpi":
        return [*horovodrun(), "--mpi", "-np", str(NP), sys.executable, str(PROGRAM)]
    if launcher == "function":
        driver = workdir / "driver.py"
        driver.write_text(_FUNCTION_DRIVER.format(here=str(HERE), np=NP))
        return [sys.executable, str(driver)]
    raise ValueError(launcher)


def check_round(outcomes: Iterable["Outcome"], capsys: Any) -> None:
    """Run a round (`outcomes` yields each run's `Outcome` as it ends), print each run's line past
    pytest's capture, and fail with every wrong run's line and output tail."""
    failed = []
    for out in outcomes:
        with capsys.disabled():
            print(f"\n{out.line()}", file=sys.stderr, flush=True)
        if not out.ok:
            failed.append(out)
    assert not failed, "\n\n".join(
        out.line() + "\n" + "\n".join(out.output[-40:]) for out in failed)


def processes_with(marker: str) -> List[int]:
    """Live (not zombie) processes whose environment carries ``CHAOS_MARKER=marker``."""
    return procs.processes_with(f"{MARKER_VAR}={marker}")


def _signal_later(pid: int, sig: int, delay: float, fault_at: List[float]) -> None:
    """In a thread: after `delay` s send `sig` to `pid`, noting the time in `fault_at`."""
    def send() -> None:
        time.sleep(delay)
        fault_at.append(time.time())
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    threading.Thread(target=send, daemon=True).start()


def _env(marker: str, **extra: str) -> Dict[str, str]:
    env = {**os.environ, MARKER_VAR: marker, "PYTHONUNBUFFERED": "1",
           "HOROVOD_COMPAT_FROZEN_SECONDS": f"{FROZEN_SECONDS:g}"}
    for name in ("CHAOS_FAULT", "CHAOS_RANK", "CHAOS_STEP", "CHAOS_PHASE", "CHAOS_DIR"):
        env.pop(name, None)
    env.update(extra)
    return env


def _run_process(argv: List[str], env: Dict[str, str], workdir: Path, out: Outcome,
                 on_line: Callable[[str], None]) -> float:
    """Run `argv` in its own session, feeding each output line to `on_line`; note its exit
    status in `out` and return when it exited (killed after RUN_TIMEOUT s: a problem)."""
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            out.output.append(line)
            on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        out.returncode = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        out.problems.append(f"still running {RUN_TIMEOUT:g}s after the start")
        os.killpg(proc.pid, signal.SIGKILL)
        out.returncode = proc.wait()
    exited_at = time.time()
    reader.join(timeout=10)
    return exited_at


class _FixedFaults:
    """Reads a fixed-size job's output lines: injects ``kill``/``stop``, notes the fault's time
    and the rank the driver names."""

    def __init__(self, out: Outcome, delay: float) -> None:
        self.out, self.delay = out, delay
        self.pids: Dict[int, int] = {}
        self.fault_at: List[float] = []
        self.injected = False

    def __call__(self, line: str) -> None:
        out = self.out
        m = _PID.search(line)
        if m:
            self.pids[int(m.group(1))] = int(m.group(2))
        m = _FAULT.search(line)
        if m and not self.fault_at:
            self.fault_at.append(float(m.group(3)))
            out.peer = int(m.group(2))
        m = _STEP.search(line)
        if (out.phase == "step" and out.fault in ("kill", "stop", "worker") and m
                and not self.injected and int(m.group(2)) == out.target
                and int(m.group(1)) >= out.step and out.target in self.pids):
            self.injected = True
            sig = signal.SIGSTOP if out.fault == "stop" else signal.SIGKILL
            pid = self.pids[out.target]
            if out.fault == "worker":
                pid = spark_python_worker(pid) or pid
                # (HorovodRunner: the first task of a host runs the daemon of all its ranks)
                out.lost_with = sorted(rank for rank, rank_pid in self.pids.items()
                                       if pid in procs.ancestors(rank_pid))
                out.notes.append(f"python_worker={pid} lost_with={','.join(map(str, out.lost_with))}")
            _signal_later(pid, sig, self.delay, self.fault_at)
        m = _NAMED.match(line)
        if m and out.named is None:
            out.named, out.failure_line = int(m.group(1)), line


def run(seed: int, launcher: str, fault: str, workdir: Path, target: Optional[int] = None,
        spark: Any = None, second: Optional[bool] = None, phase: str = "step") -> Outcome:
    """One run: start the job, inject `fault` as `seed` says (into rank `target` if given, else
    the seed's; ``elastic``: with a second kill during the recovery if `second`, else as the seed
    says; at `phase` of a fixed-size job, if not ``step``), check the outcome. ``spark`` runs need
    `spark`, a `spark_session`."""
    if phase != "step":
        return run_phase(seed, launcher, fault, phase, workdir, target, spark)
    if launcher == "elastic":
        return run_elastic(seed, fault, workdir, target, second)
    if launcher in SPARK_LAUNCHERS:
        return run_spark(seed, fault, _needs_spark(spark), target, launcher)
    planned, step, delay = plan(seed)
    target = planned if target is None else target
    out = Outcome(seed, launcher, fault, target, step)
    marker = uuid.uuid4().hex
    env = _env(marker, CHAOS_STEPS="400")
    if fault in ("raise", "close"):
        env.update(CHAOS_FAULT=fault, CHAOS_RANK=str(target), CHAOS_STEP=str(step))
    return _run_fixed(out, env, marker, workdir, delay)


def _run_fixed(out: Outcome, env: Dict[str, str], marker: str, workdir: Path,
               delay: float) -> Outcome:
    """Run a fixed-size job of `out`'s launcher (`env` carries its `marker`), judge its end and
    check that it left nothing behind."""
    shm_before, started = shm_segments(), time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    watch = _FixedFaults(out, delay)
    exited_at = _run_process(_argv(out.launcher, workdir), env, workdir, out, watch)
    if watch.fault_at:
        out.seconds = exited_at - watch.fault_at[0]
    _judge(out)
    _check_left(out, lambda: processes_with(marker))
    _check_shm(out, shm_before, started)
    procs.stop_warm_servers(f"{MARKER_VAR}={marker}")  # the run's own: its marker keys it
    return out


def run_phase(seed: int, launcher: str, fault: str, phase: str, workdir: Path,
              target: Optional[int] = None, spark: Any = None) -> Outcome:
    """One run of a fixed-size job whose target rank strikes itself with `fault` at `phase`
    (``spark``: on `spark`, a `spark_session`)."""
    if launcher not in PHASE_LAUNCHERS or fault not in phase_faults(launcher) or phase not in PHASES:
        raise ValueError(f"phase faults: launchers {PHASE_LAUNCHERS}, faults {PHASE_FAULTS} "
                         f"(distributor: no stop), phases {PHASES}; got {launcher} {fault} {phase}")
    planned, step, _delay = plan(seed)
    target = planned if target is None else target
    step = CHECKPOINT_EVERY * (1 + step % 4) - 1 if phase == "checkpoint" else -1
    out = Outcome(seed, launcher, fault, target, step, phase=phase)
    workdir.mkdir(parents=True, exist_ok=True)  # (CHAOS_DIR: the checkpoint's folder)
    strike = {"CHAOS_STEPS": "30", "CHAOS_PHASE": phase, "CHAOS_FAULT": fault,
              "CHAOS_RANK": str(target), "CHAOS_STEP": str(step), "CHAOS_DIR": str(workdir)}
    if launcher in SPARK_LAUNCHERS:
        return _run_spark_job(out, strike, _needs_spark(spark), 0.0)
    marker = uuid.uuid4().hex
    env = _env(marker, **strike, **(SHM_OFF if launcher == "tcp" else {}))
    return _run_fixed(out, env, marker, workdir, 0.0)


def _judge(out: Outcome) -> None:
    problems = out.problems
    bound = exit_bound(out.fault, out.phase)
    if out.seconds is None:
        problems.append("the fault was never injected (did the job start?)")
    elif out.seconds > bound:
        problems.append(f"exited {out.seconds:.2f}s after the fault (bound {bound:g}s)")
    if out.returncode == 0:
        problems.append("exit status 0")
    if out.named is None:
        problems.append("the driver named no rank")
    elif out.fault == "close":
        ends = {out.target, out.peer}
        if out.peer is None or out.peer < 0:
            problems.append("the program found no connection to close")
        elif out.named not in ends:
            problems.append(f"named rank {out.named}, not an end of the closed connection {sorted(ends)}")
    elif out.fault == "worker":
        if out.named not in out.lost_with:
            problems.append(f"named rank {out.named}, not one lost with the Python worker "
                            f"(ranks {out.lost_with})")
    elif out.named != out.target:
        problems.append(f"named rank {out.named} instead of rank {out.target}")
    elif out.fault == "kill" and "killed by SIGKILL" not in out.failure_line:
        problems.append(f"not named as killed by SIGKILL: {out.failure_line!r}")
    elif out.fault == "raise" and "ChaosError" not in out.failure_line:
        problems.append(f"ChaosError not named: {out.failure_line!r}")
    elif out.fault == "stop" and "stopped responding" not in out.failure_line:
        problems.append(f"not named as stopped responding: {out.failure_line!r}")


def shm_segments() -> Dict[str, float]:
    """{name: modification time} of the runtime's segments in /dev/shm now (`shm_names`)."""
    found = {}
    directory = Path(shm_names.DIRECTORY)
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.name.startswith(shm_names.PREFIX):
                with contextlib.suppress(FileNotFoundError):  # unlinked meanwhile
                    found[entry.name] = entry.stat().st_mtime
    return found


def _check_shm(out: Outcome, before: Dict[str, float], started: float) -> None:
    """No segment the run made may stay in /dev/shm: one made since `started` that was not there
    before must be gone `LEFT_SECONDS` after the job ended (its owner unlinks it once mapped, the
    launcher removes it when its owner was killed first; another test's, made meanwhile, goes as
    soon)."""
    left = _still_there(lambda: sorted(name for name, made in shm_segments().items()
                                       if name not in before and made >= started - 1.0))
    if left:
        out.problems.append(f"shared-memory segments left in {shm_names.DIRECTORY}: {left}")
        for name in left:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(shm_names.DIRECTORY, name))


def _still_there(find: Callable[[], Any]) -> Any:
    """What `find` finds `LEFT_SECONDS` from now, or nothing as soon as it finds nothing."""
    deadline = time.monotonic() + LEFT_SECONDS
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = find()
    return left


def _check_left(out: Outcome, find: Callable[[], List[int]]) -> None:
    """Nothing `find` finds may be running `LEFT_SECONDS` after the job ended (what is, is
    SIGKILLed)."""
    left = _still_there(find)
    if left:
        out.left = left
        out.problems.append(f"processes left running: {procs.commands(left) or left}")
        procs.sigkill(left)


# ---- elastic jobs -----------------------------------------------------------------------------
class _ElasticFaults:
    """Reads an elastic job's output: injects the kills, notes the faults (time, worker id, rank
    in its round), the driver's record of each failed worker, and the recovery."""

    def __init__(self, out: Outcome, second: bool, second_rank: int, delay: float) -> None:
        self.out, self.second, self.second_rank, self.delay = out, second, second_rank, delay
        self.pids: Dict[int, int] = {}        # worker id -> pid
        self.faults: List[Tuple[float, int, int]] = []  # (time, worker id, rank)
        self.attempts: Dict[int, Tuple[Optional[int], str, str]] = {}  # worker id -> (rank, what, action)
        self.started: List[int] = []          # worker ids in order of their first line
        self.recovered_at: Optional[float] = None  # first step after the first fault's reset
        self.rss_kb: Dict[int, List[int]] = {}  # pid -> its resident memory at each of its resets
        self.stuck: Optional[int] = None      # worker id of the one whose set-up never ended
        self._reset_seen = False

    def _kill(self, wid: int, rank: int, delay: float = 0.0) -> None:
        """SIGKILL worker `wid` (rank `rank` of its round) after `delay` s; noted at once (a
        second kill waits for the first's reset)."""
        self.faults.append((time.time() + delay, wid, rank))
        _signal_later(self.pids[wid], signal.SIGKILL, delay, [])

    def __call__(self, line: str) -> None:
        out = self.out
        m = _ATTEMPT.search(line)
        if m:
            rank = int(m.group(2)) if m.group(2) is not None else None
            self.attempts.setdefault(int(m.group(1)), (rank, m.group(3), m.group(4)))
            return
        m = _WORKER.match(line)
        if not m:
            return
        wid, text = int(m.group(1)), m.group(2)
        if wid not in self.started:
            self.started.append(wid)
        m = _PID.search(text)
        if m:
            self.pids[wid] = int(m.group(2))
        if _STUCK.search(text):
            self.stuck = wid
        m = _FAULT.search(text)
        if m and out.fault != "kill":  # injected by the program itself
            self.faults.append((float(m.group(3)), wid, int(m.group(1))))
        m = _RESET.search(text)
        if m and m.group(4):
            self.rss_kb.setdefault(int(m.group(3)), []).append(int(m.group(4)))
        if m and self.faults:
            self._reset_seen = True
            if (out.fault == "kill" and self.second and len(self.faults) == 1
                    and int(m.group(1)) == self.second_rank and wid != self.faults[0][1]):
                self.pids[wid] = int(m.group(3))
                self._kill(wid, int(m.group(1)))  # during the recovery: before the state's sync
        m = _STEP.search(text)
        if m:
            # (after ``stuck`` no worker of the first round is left to reset: a step of the
            # replacements is the recovery; after ``start`` the survivors' hvd.init() joins the
            # next round itself, before any state exists to reset)
            if (self.faults and (self._reset_seen or out.fault in ("stuck", "start"))
                    and self.recovered_at is None):
                self.recovered_at = time.time()
            if (out.fault == "kill" and not self.faults and int(m.group(2)) == out.target
                    and int(m.group(1)) >= out.step and wid in self.pids):
                self._kill(wid, out.target, self.delay)


def run_elastic(seed: int, fault: str, workdir: Path, target: Optional[int] = None,
                second: Optional[bool] = None) -> Outcome:
    """One elastic run (see the module's docstring); `target` and `second` (a second kill during
    the recovery) override the seed's choice. Fault ``resets``: a SIGKILL `RESETS` times
    (`elastic_program`), and each survivor's memory must stay flat across its resets
    (`RESET_RSS_BOUND_MB`)."""
    planned, step, planned_second, second_rank, delay = elastic_plan(seed)
    target = planned if target is None else target
    second = planned_second if second is None else second
    out = Outcome(seed, "elastic", fault, target, step)
    marker = uuid.uuid4().hex
    shm_before, started = shm_segments(), time.time()
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    discover = workdir / "discover.sh"
    discover.write_text(f"#!/bin/sh\necho localhost:{NP}\n")
    discover.chmod(0o755)
    env = _env(marker, CHAOS_DIR=str(data), CHAOS_SAMPLES=str(ELASTIC_SAMPLES))
    other = (target + 1 + second_rank) % NP  # a rank other than the target, chosen by the seed
    if fault in ("raise", "stop", "resets", "start", "commit", "last", "joining"):
        env.update(CHAOS_FAULT=fault, CHAOS_RANK=str(target), CHAOS_STEP=str(step),
                   CHAOS_REPEAT=str(RESETS if fault == "resets" else 1))
    elif fault == "broadcast":
        # another rank comes late to the transfer the target dies in; not rank 0, the transfer's
        # root, which fails at once and resets, so the late one waits on a rank that has left
        late = 1 if target == 2 else 2
        env.update(CHAOS_FAULT=fault, CHAOS_RANK=str(target), CHAOS_LATE_RANK=str(late))
    elif fault in ("init", "stuck"):  # another one dies as the next round forms
        env.update(CHAOS_FAULT="broadcast", CHAOS_RANK=str(target), CHAOS_INIT_RANK=str(other))
        if fault == "stuck":  # and the third one's set-up of that round never ends
            # (the death waits for the stuck worker's group to form: the same round for both)
            env.update(CHAOS_STUCK_RANK=str(3 - target - other), CHAOS_INIT_AFTER="stuck",
                       HOROVOD_COMPAT_LOST_ROUND_EXIT_SECONDS=f"{STUCK_EXIT_SECONDS:g}")
    argv = [*horovodrun(), "-np", str(NP), "--min-np", str(NP - 1), "--max-np", str(NP),
            "--host-discovery-script", str(discover), sys.executable, str(ELASTIC_PROGRAM)]
    watch = _ElasticFaults(out, second and fault == "kill", second_rank, delay)
    _run_process(argv, env, workdir, out, watch)
    _judge_elastic(out, watch, data)
    if fault == "resets":
        _judge_repeated_resets(out, watch, RESETS)
    _check_left(out, lambda: processes_with(marker))
    _check_shm(out, shm_before, started)
    procs.stop_warm_servers(f"{MARKER_VAR}={marker}")
    return out


def _judge_elastic(out: Outcome, watch: _ElasticFaults, data: Path) -> None:
    problems = out.problems
    faults = watch.faults
    if not faults:
        problems.append("the fault was never injected (did the job start?)")
        return
    if watch.second and len(faults) < 2:
        problems.append("the second kill (during the recovery) was never injected")
    out.named = (watch.attempts.get(faults[0][1]) or (None,))[0]  # the driver's word for it
    out.notes.append("faults=" + ",".join(f"w{wid}/r{rank}" for _, wid, rank in faults))
    if watch.recovered_at is not None:
        out.notes.append(f"recovery={watch.recovered_at - faults[0][0]:.2f}")
    if out.returncode != 0:
        problems.append(f"exit status {out.returncode}, not 0")
    try:
        result = json.loads((data / "result.json").read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"no result from the last round's rank 0: {exc}")
    else:
        counts = result["counts"]
        out.notes.append(f"final_size={result['size']}")
        if out.fault == "start" and result["size"] != NP:
            # (struck at the start: the whole job is left for the replacement to join)
            problems.append(f"the last round had {result['size']} workers: the replacement of "
                            "the worker lost in the first round's set-up never joined")
        wrong = {i: c for i, c in enumerate(counts) if c != 1}
        if len(counts) != ELASTIC_SAMPLES or wrong:
            shown = dict(list(wrong.items())[:10])
            problems.append(f"not every committed sample exactly once: {len(wrong)} wrong "
                            f"(sample: count) {shown}")
    trained = set()
    for log in data.glob("trained.*"):
        trained.update(int(x) for x in log.read_text().split())
    missing = sorted(set(range(ELASTIC_SAMPLES)) - trained)
    if missing:
        problems.append(f"samples no rank trained on: {missing[:10]} ({len(missing)})")
    expected_what = ELASTIC_WHAT[out.fault]
    if watch.recovered_at is None:
        problems.append("no step ran after the fault")
    elif watch.recovered_at - faults[0][0] > exit_bound(out.fault):
        problems.append(f"the next step ran {watch.recovered_at - faults[0][0]:.2f}s after the "
                        f"fault (bound {exit_bound(out.fault):g}s)")
    replacements = 0
    for _, wid, rank in faults:
        attempt = watch.attempts.get(wid)
        if attempt is None:
            problems.append(f"the driver did not name failed worker {wid} (rank {rank})")
            continue
        named_rank, what, action = attempt
        if named_rank != rank or expected_what not in what:
            problems.append(f"worker {wid} named as rank {named_rank} that {what!r}, not as "
                            f"rank {rank} with {expected_what}")
        if "replacement worker" not in action:
            problems.append(f"no replacement for worker {wid} although discovery offers its "
                            f"slot: {action!r}")
        else:
            replacements += 1
    if out.fault == "stuck":
        _judge_stuck(out, watch)
    joined = [wid for wid in watch.started if wid >= NP]
    out.notes.append(f"replaced={replacements} joined={len(joined)}")
    out.failure_line = "; ".join(f"worker {wid}: {watch.attempts.get(wid)}" for _, wid, _ in faults)


def _judge_stuck(out: Outcome, watch: _ElasticFaults) -> None:
    """Fault ``stuck``: the worker whose set-up of the round never ended exited on its own and
    the driver started a replacement for it."""
    if watch.stuck is None:
        out.problems.append("no worker got stuck in the set-up of the round (no chaos-stuck line)")
        return
    attempt = watch.attempts.get(watch.stuck)
    if not any("the connection did not end within" in line for line in out.output):
        out.problems.append(f"stuck worker {watch.stuck} never said that it leaves the lost round")
    if attempt is None or "replacement worker" not in attempt[2]:
        out.problems.append(f"stuck worker {watch.stuck} was not named and replaced: {attempt!r}")
    else:
        out.notes.append(f"stuck=w{watch.stuck}")


def _judge_repeated_resets(out: Outcome, watch: _ElasticFaults, repeat: int) -> None:
    """Every strike of a repeated fault happened, and the memory of each worker that lived
    through three resets or more grew by less than `RESET_RSS_BOUND_MB` from its second reset to
    its last (the first may allocate once: a replacement's first round)."""
    if len(watch.faults) != repeat:
        out.problems.append(f"{len(watch.faults)} strikes of the repeated fault, not {repeat}")
    growth = {pid: (kb[-1] - kb[1]) / 1024 for pid, kb in watch.rss_kb.items() if len(kb) >= 3}
    if not growth:
        out.problems.append(f"no worker lived through 3 resets: {watch.rss_kb}")
    out.notes.append("rss_growth_mb=" + ",".join(f"{mb:.1f}" for mb in growth.values())
                     + f" over_resets={max((len(watch.rss_kb[p]) for p in growth), default=0)}")
    for pid, mb in growth.items():
        if mb >= RESET_RSS_BOUND_MB:
            out.problems.append(f"worker pid {pid}: resident memory grew by {mb:.1f} MB from its "
                                f"second reset to its last {watch.rss_kb[pid]} kB "
                                f"(bound {RESET_RSS_BOUND_MB:g} MB)")


# ---- Spark ------------------------------------------------------------------------------------
SPARK_MASTER = f"local[{NP}]"


def _importable(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@contextlib.contextmanager
def spark_session(app_name: str = "chaos") -> Iterator[Any]:
    """A ``local[3]`` SparkSession for a set of ``spark`` runs; on exit it is stopped and its
    JVM and every process under it must be gone (checked by PID)."""
    _importable(HERE.parent / "distributor")  # spark_clusters, the Spark tests' helpers
    from spark_clusters import alive, descendants, local_spark  # noqa: PLC0415

    family: List[int] = []
    with local_spark(app_name, SPARK_MASTER) as spark:
        from pyspark import SparkContext  # noqa: PLC0415

        spark.chaos_jvm = jvm = SparkContext._gateway.proc.pid
        try:
            yield spark
        finally:
            family += [jvm, *descendants(jvm)]
    deadline = time.monotonic() + 20
    while any(alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in family if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"the Spark JVM or its workers outlived the session: {left}"


def spark_python_worker(rank_pid: int) -> Optional[int]:
    """The Spark Python worker above a rank process: its nearest ancestor that PySpark's daemon
    forked (a worker keeps the daemon's command line); None if there is none."""
    return next((pid for pid in procs.ancestors(rank_pid)
                 if "pyspark.daemon" in procs.cmdline(pid) or "pyspark/daemon.py" in procs.cmdline(pid)),
                None)


def spark_ranks(jvm: int) -> List[int]:
    """Rank processes under the Spark JVM: a child of an executor's fork server (and what it
    started), a ``distributor.rank_entry`` process, or Open MPI's (HorovodRunner's mpirun and
    its daemons). Python workers and fork servers stay between jobs by design."""
    _importable(HERE.parent / "distributor")  # spark_clusters, the Spark tests' helpers
    from spark_clusters import descendants  # noqa: PLC0415

    found = []
    for pid in descendants(jvm):
        command = procs.cmdline(pid)
        if "distributor.rank_entry" in command or os.path.basename(command.split(" ", 1)[0]) in (
                "mpirun", "prterun", "prted", "orted") or (
                "distributor.forkserver" in procs.cmdline(procs.parent(pid)) and procs.alive(pid)):
            found.append(pid)
            found.extend(descendants(pid))
    return sorted(set(found))


def _spark_python_side(spark: Any) -> List[int]:
    """This process (the driver of ``horovod.spark.run``) and the Python workers under the Spark
    JVM, which stay between jobs by design (not PySpark's daemon, the JVM's child that forks
    them: it listens for the JVM, from its start)."""
    _importable(HERE.parent / "distributor")  # spark_clusters, the Spark tests' helpers
    from spark_clusters import descendants  # noqa: PLC0415

    return [os.getpid()] + [pid for pid in descendants(spark.chaos_jvm)
                            if "python" in procs.cmdline(pid).split(" ", 1)[0]
                            and procs.parent(pid) != spark.chaos_jvm]


def _check_listening(out: Outcome, find: Callable[[], Set[Tuple[int, int]]]) -> None:
    """No process that stays after the job (the driver, Spark's Python workers) may still listen
    on a port it opened for the job `LEFT_SECONDS` after the job ended: a socket of the job's
    control plane left open there would outlive every job after it (the workers are reused)."""
    left = _still_there(find)
    if left:
        out.problems.append("ports still listening after the job: " + ", ".join(
            f"{port} (pid {pid}: {procs.cmdline(pid)[:80]})" for pid, port in sorted(left)))


class _LineWriter:
    """A text stream (``horovod.spark.run``'s stdout/stderr) that hands on whole lines."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line, self.buffer, self.lock = on_line, "", threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.buffer += text
            *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            self.on_line(line)
        return len(text)

    def flush(self) -> None:
        pass


def _needs_spark(spark: Any) -> Any:
    if spark is None:
        raise ValueError("a spark run needs spark=<a spark_session()>")
    return spark


def run_spark(seed: int, fault: str, spark: Any, target: Optional[int] = None,
              launcher: str = "spark") -> Outcome:
    """One run of the 3-rank training program under Spark launcher `launcher`
    (`SPARK_LAUNCHERS`) in this process, on `spark` (a `spark_session`): the same faults and
    judgement as the fixed-size launchers, the exception the launcher raises standing for the
    driver's exit."""
    planned, step, delay = plan(seed)
    target = planned if target is None else target
    out = Outcome(seed, launcher, fault, target, step)
    env = {"CHAOS_STEPS": "400"}
    if fault in ("raise", "close"):
        env.update(CHAOS_FAULT=fault, CHAOS_RANK=str(target), CHAOS_STEP=str(step))
    return _run_spark_job(out, env, spark, delay)


def _spark_job(launcher: str, env: Dict[str, str], writer: "_LineWriter") -> Callable[[], Any]:
    """The call that runs the training program under `launcher` with `env`, its ranks' output
    going to `writer`."""
    _importable(HERE)
    import train_program  # noqa: PLC0415

    if launcher == "spark":
        import horovod.spark  # noqa: PLC0415

        return lambda: horovod.spark.run(train_program.main, num_proc=NP, env=env, stdout=writer,
                                         stderr=writer)
    if launcher == "runner":
        from sparkdl import HorovodRunner  # noqa: PLC0415

        def call() -> Any:
            # HorovodRunner forwards the driver's HOROVOD_* variables (the frozen bound among them)
            with mock.patch.dict(os.environ, {k: v for k, v in env.items() if k.startswith("HOROVOD_")}):
                return HorovodRunner(np=NP, driver_log_verbosity="all").run(train_program.main_in,
                                                                           env=env)
        return call
    if launcher == "distributor":
        from distributor import TorchDistributor  # noqa: PLC0415

        return lambda: TorchDistributor(num_processes=NP, local_mode=False, use_gpu=False).run(
            train_program.torch_main, env)
    raise ValueError(f"Spark launchers: {SPARK_LAUNCHERS}; got {launcher}")


def _run_spark_job(out: Outcome, env: Dict[str, str], spark: Any, delay: float) -> Outcome:
    """Run `out`'s job under its Spark launcher with `env` on `spark`, judge its end and check
    that it left nothing behind: no rank, no Spark job, no port of the job's still listening, no
    shared-memory segment."""
    _importable(HERE.parent / "distributor")  # spark_clusters, the Spark tests' helpers
    from spark_clusters import no_active_jobs  # noqa: PLC0415

    env = {**env, "HOROVOD_COMPAT_FROZEN_SECONDS": f"{FROZEN_SECONDS:g}"}
    watch = _FixedFaults(out, delay)
    listening_before = procs.listening(_spark_python_side(spark))
    shm_before, started = shm_segments(), time.time()

    def on_line(line: str) -> None:
        out.output.append(line)
        watch(line)

    writer = _LineWriter(on_line)
    job = _spark_job(out.launcher, env, writer)
    outcome: List[Any] = []

    def call() -> None:
        try:
            # (HorovodRunner and TorchDistributor print the ranks' lines to sys.stdout)
            with contextlib.redirect_stdout(writer), contextlib.redirect_stderr(writer):
                outcome.append(job())
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(RUN_TIMEOUT)
    exited_at = time.time()
    if caller.is_alive():
        out.problems.append(f"{SPARK_CALLS[out.launcher]} still running {RUN_TIMEOUT:g}s after "
                            "the start")
        spark.sparkContext.cancelAllJobs()
        caller.join(60)
    result = outcome[0] if outcome else None
    if isinstance(result, BaseException):
        out.returncode = 1
        first = str(result).splitlines()[0] if str(result) else type(result).__name__
        m = re.match(r"Rank (\d+) ", first)
        if m:
            out.named, out.failure_line = int(m.group(1)), first
        out.output.append(f"{SPARK_CALLS[out.launcher]} raised {type(result).__name__}: {result}")
    elif outcome:
        out.returncode = 0
    if watch.fault_at:
        out.seconds = exited_at - watch.fault_at[0]
    _judge(out)
    pids = list(watch.pids.values())
    _check_left(out, lambda: sorted({p for p in pids if procs.alive(p)} | set(spark_ranks(spark.chaos_jvm))))
    _check_listening(out, lambda: procs.listening(_spark_python_side(spark)) - listening_before)
    _check_shm(out, shm_before, started)
    # run() returns once the job's action has ended; the status tracker hears of that end from
    # Spark's listener bus, later (no_active_jobs): 10 s, as for processes above
    if not no_active_jobs(spark, timeout=10.0):
        out.problems.append(f"a Spark job is still active 10 s after {SPARK_CALLS[out.launcher]} "
                            "returned")
    return out


# ---- rounds -----------------------------------------------------------------------------------
def run_seeds(base: int, launcher: str, fault: str, runs: int) -> List[int]:
    """The seeds of `runs` runs of `fault` under `launcher` in a round seeded with `base`."""
    rng = random.Random(f"{base}:{launcher}:{fault}")
    return [rng.randrange(1 << 31) for _ in range(runs)]


def main(argv: Optional[List[str]] = None) -> int:
    """``python tests/chaos/harness.py LAUNCHER FAULT SEED... [--target R] [--second]``: rerun
    single runs (the seeds that a round printed; ``--target`` and ``--second`` repeat the short
    round's overrides: the rank hit, an elastic second kill during the recovery), showing the
    job's last output lines of each failed one (``--output``: every run's whole output)."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(
        prog="harness.py", description="cases: " + "; ".join(
            f"{launcher} {{{','.join(faults)}}}" for launcher, faults in CASES.items()))
    parser.add_argument("launcher", choices=sorted(set(CASES) | set(PHASE_LAUNCHERS)))
    parser.add_argument("fault")
    parser.add_argument("seeds", nargs="+", type=int, metavar="SEED")
    parser.add_argument("--target", type=int, default=None, help="the rank to hit")
    parser.add_argument("--second", action="store_true", default=None,
                        help="elastic kill: a second kill during the recovery")
    parser.add_argument("--output", action="store_true",
                        help="print each run's whole output, passing runs too (to compare a passing "
                             "run's sequence of events with a failing one's)")
    parser.add_argument("--phase", default="step", choices=("step",) + PHASES,
                        help=f"a fixed-size job's phase fault (launchers {', '.join(PHASE_LAUNCHERS)};"
                             f" faults {', '.join(PHASE_FAULTS)})")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.phase != "step":
        if args.launcher not in PHASE_LAUNCHERS or args.fault not in phase_faults(args.launcher):
            parser.error(f"phase faults: launchers {', '.join(PHASE_LAUNCHERS)}, faults "
                         f"{', '.join(PHASE_FAULTS)} (distributor: no stop)")
    elif args.fault not in CASES.get(args.launcher, ()):
        parser.error(f"{args.launcher} has the faults {', '.join(CASES[args.launcher])}")
    failures = 0
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        spark = (stack.enter_context(spark_session()) if args.launcher in SPARK_LAUNCHERS
                 else None)
        for seed in args.seeds:
            out = run(seed, args.launcher, args.fault, tmp / str(seed), target=args.target,
                      spark=spark, second=args.second, phase=args.phase)
            print(out.line(), flush=True)
            failures += not out.ok
            if args.output:
                print("\n".join(out.output), flush=True)
            elif not out.ok:
                print("\n".join(out.output[-60:]), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
