"""The chaos harness: run `train_program.py` on 3 ranks, inject one fault at a random (seeded)
moment into a random rank, and check what the driver says and does.

Launchers (``LAUNCHERS``): ``horovodrun`` (``horovodrun -np 3 python train_program.py``, the
direct launcher), ``function`` (``horovod.run(train_program.main, num_proc=3)``) and ``mpi``
(``horovodrun --mpi -np 3 ...``). Faults (``FAULTS``):

* ``kill``: SIGKILL, from outside, of the process that trains on the target rank, once it printed
  a chosen step. Right: the target rank is named, "killed by SIGKILL".
* ``raise``: the target rank raises ``ChaosError`` at a chosen step. Right: the target rank is
  named, with ``ChaosError``.
* ``close``: at a chosen step the target rank shuts down its TCP connections to one other rank
  (gloo's), as a network fault between the two would. Both ends then fail alike ("Connection
  closed by peer"), and either may fail first: right is one of the two ends of those connections.

Every run must also: end within ``EXIT_BOUND`` seconds of the fault, with a non-zero exit status,
and leave no process behind (every process of a run carries ``CHAOS_MARKER`` in its environment).

``run(seed, launcher, fault)`` is deterministic in what it injects: the seed picks the target rank,
the step and (for ``kill``) a delay inside the step.
"""
from __future__ import annotations

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
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "train_program.py"
NP = 3
LAUNCHERS = ("horovodrun", "function", "mpi")
FAULTS = ("kill", "raise", "close")
#: Seconds from the fault to the driver's exit.
EXIT_BOUND = float(os.environ.get("CHAOS_EXIT_BOUND", "5"))
#: Seconds a whole run may take (start-up included) before it counts as hung.
RUN_TIMEOUT = float(os.environ.get("CHAOS_RUN_TIMEOUT", "120"))
MARKER_VAR = "CHAOS_MARKER"

_PID = re.compile(r"chaos-pid rank=(\d+) pid=(\d+)")
_STEP = re.compile(r"step (\d+) rank (\d+) ")
_FAULT = re.compile(r"chaos-fault rank=(\d+) peer=(-?\d+) t=([\d.]+)")
_NAMED = re.compile(r"(?:^horovodrun: |^chaos-driver: )Rank (\d+) (.*)$")

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

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        secs = "-" if self.seconds is None else f"{self.seconds:.2f}"
        verdict = "ok" if self.ok else "FAILED: " + "; ".join(self.problems)
        peer = f" peer={self.peer}" if self.fault == "close" else ""
        return (f"chaos seed={self.seed} launcher={self.launcher} fault={self.fault} "
                f"target={self.target}{peer} step={self.step} named={self.named} "
                f"seconds={secs} rc={self.returncode} {verdict}")


def plan(seed: int) -> tuple:
    """(target rank, step, delay) that `seed` injects."""
    rng = random.Random(seed)
    return rng.randrange(NP), rng.randint(2, 25), rng.uniform(0.0, 0.03)


def _argv(launcher: str, workdir: Path) -> List[str]:
    if launcher == "horovodrun":
        return [*horovodrun(), "-np", str(NP), sys.executable, str(PROGRAM)]
    if launcher == "mpi":
        return [*horovodrun(), "--mpi", "-np", str(NP), sys.executable, str(PROGRAM)]
    if launcher == "function":
        driver = workdir / "driver.py"
        driver.write_text(_FUNCTION_DRIVER.format(here=str(HERE), np=NP))
        return [sys.executable, str(driver)]
    raise ValueError(launcher)


def processes_with(marker: str) -> List[int]:
    """Live (not zombie) processes whose environment carries ``CHAOS_MARKER=marker``."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env:
                if needle not in env.read():
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def run(seed: int, launcher: str, fault: str, workdir: Path) -> Outcome:
    """One run: start the job, inject `fault` as `seed` says, check the outcome."""
    target, step, delay = plan(seed)
    out = Outcome(seed, launcher, fault, target, step)
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER_VAR: marker, "PYTHONUNBUFFERED": "1", "CHAOS_STEPS": "400"}
    for name in ("CHAOS_FAULT", "CHAOS_RANK", "CHAOS_STEP"):
        env.pop(name, None)
    if fault in ("raise", "close"):
        env.update(CHAOS_FAULT=fault, CHAOS_RANK=str(target), CHAOS_STEP=str(step))
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(_argv(launcher, workdir), cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    pids: Dict[int, int] = {}
    fault_at: List[float] = []
    killed = threading.Event()

    def kill(pid: int) -> None:
        time.sleep(delay)
        fault_at.append(time.time())
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            out.output.append(line)
            m = _PID.search(line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            m = _FAULT.search(line)
            if m and not fault_at:
                fault_at.append(float(m.group(3)))
                out.peer = int(m.group(2))
            m = _STEP.search(line)
            if (fault == "kill" and m and not killed.is_set() and int(m.group(2)) == target
                    and int(m.group(1)) >= step and target in pids):
                killed.set()
                threading.Thread(target=kill, args=(pids[target],), daemon=True).start()
            m = _NAMED.match(line)
            if m and out.named is None:
                out.named, out.failure_line = int(m.group(1)), line

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
    if fault_at:
        out.seconds = exited_at - fault_at[0]
    _judge(out, marker)
    return out


def _judge(out: Outcome, marker: str) -> None:
    problems = out.problems
    if out.seconds is None:
        problems.append("the fault was never injected (did the job start?)")
    elif out.seconds > EXIT_BOUND:
        problems.append(f"exited {out.seconds:.2f}s after the fault (bound {EXIT_BOUND:g}s)")
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
    elif out.named != out.target:
        problems.append(f"named rank {out.named} instead of rank {out.target}")
    elif out.fault == "kill" and "killed by SIGKILL" not in out.failure_line:
        problems.append(f"not named as killed by SIGKILL: {out.failure_line!r}")
    elif out.fault == "raise" and "ChaosError" not in out.failure_line:
        problems.append(f"ChaosError not named: {out.failure_line!r}")
    deadline = time.monotonic() + 3.0
    left = processes_with(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_with(marker)
    if left:
        out.left = left
        problems.append(f"processes left running: {left}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_seeds(base: int, launcher: str, fault: str, runs: int) -> List[int]:
    """The seeds of `runs` runs of `fault` under `launcher` in a round seeded with `base`."""
    rng = random.Random(f"{base}:{launcher}:{fault}")
    return [rng.randrange(1 << 31) for _ in range(runs)]


def main(argv: Optional[List[str]] = None) -> int:
    """``python tests/chaos/harness.py LAUNCHER FAULT SEED...``: rerun single runs (the seeds
    that a round printed), showing the job's last output lines of each failed one."""
    import tempfile

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] not in LAUNCHERS or args[1] not in FAULTS:
        print(f"usage: harness.py {{{','.join(LAUNCHERS)}}} {{{','.join(FAULTS)}}} SEED...",
              file=sys.stderr)
        return 2
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in map(int, args[2:]):
            out = run(seed, args[0], args[1], Path(tmp) / str(seed))
            print(out.line(), flush=True)
            if not out.ok:
                failures += 1
                print("\n".join(out.output[-60:]), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
