"""Running an original Horovod program and its rewrite side by side, for the tests that compare
what they print: the original under horovodrun (this project's shim), the native one under the
torchrun contract."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

from horovod_compat.migrate import migrate_source
from warm import run_script_warm

ROOT = Path(__file__).resolve().parents[3]


def printed(tmp_path: Path, pattern: str, *argv: str, env: Optional[Dict[str, str]] = None,
            native_group: bool = False) -> list:
    """Run ``python ARGV...`` (a launcher and a program) in `tmp_path` with this project
    importable; it must succeed without a traceback. Returns the sorted matches of `pattern` in
    its output (torchrun's ranks share one pipe: a line may run into the next one).

    `native_group`: the program makes its own torch.distributed gloo group, so a rank may abort
    at interpreter exit after its work is done (torch 2.13, about 1 run in 10;
    migration_guide/troubleshooting.md). That abort, and only it, is accepted; the caller compares
    the output, so a rank that stopped early still fails the test."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    both = done.stdout + done.stderr
    if native_group and done.returncode != 0:
        assert "terminate called without an active exception" in both and "SIGABRT" in both, \
            done.stdout[-3000:] + done.stderr[-3000:]
    else:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted(re.findall(pattern, done.stdout))


HOROVODRUN = ("-m", "horovod_compat.run", "-np")


def native_printed(script: Path, ranks: int, pattern: str, env: Optional[Dict[str, str]] = None,
                   argv: Sequence[str] = ()) -> list:
    """Run a native script on `ranks` local ranks under the torchrun contract (this project's
    engine's script mode, its ranks forked warm: tests/warm.py) and return the sorted matches of `pattern` in what
    its ranks printed. Not `torchrun` itself: with gloo on torch 2.13 a rank of plain torchrun
    sometimes aborts at interpreter exit after the script finished ("terminate called without an
    active exception"), plain DDP scripts included (migration_guide/troubleshooting.md)."""
    lines: list = []
    run_script_warm(str(script), argv, num_processes=ranks, env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=240,
               output=lambda rank, stream, line: lines.append(line) if stream == "stdout" else None)
    return sorted(re.findall(pattern, "\n".join(lines)))




def migrated_alike(tmp_path: Path, program: str, line: str, count: int):
    """The migration of `program`, once its native form under the torchrun contract printed, on 2
    ranks, the `count` lines matching `line` that the original printed under horovodrun (in
    `tmp_path`, where the caller may have put the modules the program imports)."""
    original = tmp_path / "original.py"
    original.write_text(program)
    result = migrate_source(program, "original.py")
    native = tmp_path / "native.py"
    native.write_text(result.source)
    want = printed(tmp_path, line, *HOROVODRUN, "2", sys.executable, str(original))
    assert len(want) == count, want
    assert native_printed(native, 2, line) == want
    return result
