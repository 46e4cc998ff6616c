"""Do migrated programs exit 0 every time under real ``torchrun``? (issue: "a migrated program exits
0 every time, not only most times").

Rewrites each named program of the test corpus (tests/horovod_compat/migrate/corpus) with the
rewriter's defaults (``--emulate`` for the corpus test's EMULATED programs, as that test does),
then runs the native output ``--runs`` times (default 20) under ``python -m torch.distributed.run
--standalone --nproc-per-node 2`` on CPU, one run after the other, and prints per program: runs,
exit statuses, runs whose printed numbers differ from the first run's, and the seconds per run.
A run that aborts at exit (torch 2.13 gloo: "terminate called without an active exception",
migration_guide/troubleshooting.md) shows as exit status 1 with ``SIGABRT`` in torchrun's report,
and is counted as a failure: the output must not leave that to chance.

Usage: ``python benchmarks/migrated_exits.py [--runs N] [PROGRAM.py ...]`` (default: four programs
of four shapes: a trainer class made data-parallel in place, a module-level DDP script with
clipping, DDP in ``main()`` with sub-batch accumulation, an allgather metric with a sampler;
about 10 s a run on 2 cores).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from horovod_compat.migrate import migrate_source  # noqa: E402

CORPUS = ROOT / "tests" / "horovod_compat" / "migrate" / "corpus"
DEFAULT = ["v01_hf_trainer.py", "u07_grad_clipping.py", "v11_argparse_fp16_compression.py",
           "u10_metrics_sampler.py"]
#: (torchrun's ranks share one pipe, and print() writes a line's text and its newline apart: two
#: ranks' lines may run together, so a number ends where its digits do)
LINE = re.compile(r"CORPUS rank=\d+ (?:step=\d+ loss=-?\d+\.\d+|final=-?\d+\.\d+)")


def emulated() -> set:
    """The corpus test's EMULATED programs (rewritten with --emulate there, and here)."""
    text = (ROOT / "tests" / "horovod_compat" / "migrate" / "test_migrate_corpus.py").read_text()
    block = text[text.index("EMULATED = {"):text.index("}", text.index("EMULATED = {"))]
    return set(re.findall(r'"(\w+\.py)"', block))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("programs", nargs="*", default=DEFAULT)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    emulate = emulated()
    print(f"{'program':36} {'runs':>4} {'exit 0':>6} {'failed':>6} {'numbers differ':>14} {'s/run':>6}")
    failures = 0
    for name in args.programs:
        source = (CORPUS / name).read_text()
        native = migrate_source(source, name, emulate=name in emulate).source
        with tempfile.TemporaryDirectory() as scratch:
            script = Path(scratch) / f"native_{name}"
            script.write_text(native)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "CORPUS_TMP": scratch,
                   "ELASTIC_CHECKPOINT": str(Path(scratch) / "elastic.pt")}
            env.pop("PYTHONPATH", None)  # the native program needs nothing of this project
            first, statuses, differ, seconds = None, [], 0, 0.0
            for _ in range(args.runs):
                for leftover in Path(scratch).iterdir():  # each run starts without the last one's files
                    if leftover == script:
                        continue
                    if leftover.is_dir():
                        shutil.rmtree(leftover)
                    else:
                        leftover.unlink()
                started = time.monotonic()
                done = subprocess.run(
                    [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                     str(script)], cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
                seconds += time.monotonic() - started
                statuses.append(done.returncode)
                numbers = sorted(LINE.findall(done.stdout))
                if first is None:
                    first = numbers
                elif numbers != first:
                    differ += 1
                if done.returncode != 0:
                    tail = (done.stdout + done.stderr)[-800:].replace("\n", " | ")
                    print(f"  {name}: exit {done.returncode}: ...{tail}")
        failed = sum(s != 0 for s in statuses)
        failures += failed + differ
        print(f"{name:36} {len(statuses):>4} {statuses.count(0):>6} {failed:>6} {differ:>14} "
              f"{seconds / len(statuses):>6.1f}")
    print(f"total: {failures} failed or differing run(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
