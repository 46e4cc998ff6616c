"""Test helper: run a command on N ranks under `horovodrun` or `torchrun` with a hard timeout.

A hang must fail the test that met it, not block CI: past the timeout the launcher's process group
gets SIGTERM (both launchers stop their ranks on it), then SIGKILL; ranks of the project's
horovodrun also die with it (the engine starts them with a parent-death signal).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from tiers import CI  # noqa: F401 (the torch tests take it from here)

# The transports: shared memory (ranks on one host, the default); the TCP mesh (what ranks on
# several hosts use), forced on one host by turning shared memory off for data and coordination;
# gloo for both (what sets larger than the mesh's limit use), forced by turning the mesh off too.
SHM_ON = {"HOROVOD_COMPAT_SHM_DATA": "1", "HOROVOD_COMPAT_SHM_CONTROL": "1"}
SHM_OFF = {"HOROVOD_COMPAT_SHM_DATA": "0", "HOROVOD_COMPAT_SHM_CONTROL": "0"}
GLOO_ONLY = {**SHM_OFF, "HOROVOD_COMPAT_TCP_CONTROL": "0", "HOROVOD_COMPAT_TCP_DATA": "0"}


@dataclass
class Launch:
    returncode: Optional[int]  # None when the launch was killed at the timeout
    output: str                # horovodrun's stdout and stderr; rank lines are "[N]<stdout>:..."
    timed_out: bool

    def rank_lines(self, rank: int) -> List[str]:
        """Rank `rank`'s lines (stdout and stderr), without Horovod's ``[N]<stdout>:`` prefix."""
        prefixes = (f"[{rank}]<stdout>:", f"[{rank}]<stderr>:")
        return [line[len(prefixes[0]):] for line in self.output.splitlines() if line.startswith(prefixes)]

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def horovodrun(np: int, command: Sequence[str], *, timeout: float, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str] = None) -> Launch:
    """`horovodrun -np N command...`, killed (and reported as timed out) after `timeout` s."""
    return _launch([sys.executable, "-m", "horovod_compat.run", "-np", str(np), *command], timeout, env, cwd)


def torchrun(np: int, command: Sequence[str], *, timeout: float, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[str] = None) -> Launch:
    """`torchrun --standalone --nproc-per-node N command...` (output not prefixed), with a hard timeout."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={np}", *command]
    return _launch(argv, timeout, env, cwd)


def _launch(argv: Sequence[str], timeout: float, env: Optional[Mapping[str, str]], cwd: Optional[str]) -> Launch:
    full_env: Dict[str, str] = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    proc = subprocess.Popen(list(argv), env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return Launch(proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        _signal(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            _signal(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return Launch(None, out, True)


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)  # the launcher leads the session started above
    except ProcessLookupError:
        pass


def marked_lines(output: str, *markers: str) -> List[str]:
    """Lines of `output` that contain one of `markers` (e.g. "SOAK FAIL")."""
    return [line for line in output.splitlines() if any(m in line for m in markers)]


def parse_fields(line: str) -> Dict[str, str]:
    """`key=value` pairs of a summary line."""
    return dict(re.findall(r"(\w+)=(\S+)", line))
