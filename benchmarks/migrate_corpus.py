"""The rewriter on a folder of Horovod programs: how many come out native, how many have their
gradients averaged by torch's data parallelism, how much each file grows, and which differences
from Horovod the output names.

For every ``*.py`` under the folder (default: the test corpus, tests/horovod_compat/migrate/corpus)
it prints one row: native or why not; what each ``hvd.DistributedOptimizer`` became (``DDP`` for
the ``DDP(model)`` wrap, ``replicate`` for the model made data-parallel in place, ``TODO`` where
torch's data parallelism cannot take it, ``emulated`` for ``_native_distributed_optimizer``, which
only ``--emulate`` writes); the lines the file grew by; the helpers pasted into it. Then the totals, side by side with the issue's targets: native files (>= 90 %),
files with a DistributedOptimizer averaged by DDP or replicate and nothing else (>= 75 %), median
growth of a native file (<= 40 lines), and the oldest torch the outputs need.

Usage: ``python benchmarks/migrate_corpus.py [--emulate] [FOLDER]`` (about 50 s for the 72-file
corpus); ``--emulate`` rewrites as the CLI's option does.
"""
from __future__ import annotations

import collections
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from horovod_compat.migrate import Kind, migrate_source, torch_api  # noqa: E402
from horovod_compat.migrate.cli import not_native  # noqa: E402

HELPER = re.compile(r"^(?:def|class) (_[Nn]ative\w+)", re.M)


def became(findings) -> list:
    """What each DistributedOptimizer of a file became, from the rewriter's notes."""
    kinds = []
    for finding in findings:
        if finding.name != "hvd.DistributedOptimizer":
            continue
        if finding.kind is Kind.TODO:
            kinds.append("TODO")
        elif "_native_distributed_optimizer" in finding.message:
            kinds.append("emulated")
        elif "replicate(" in finding.message:
            kinds.append("replicate")
        else:
            kinds.append("DDP")
    return kinds


def main(folder: Path, emulate: bool = False) -> int:
    rows = []
    for path in sorted(folder.rglob("*.py")):
        source = path.read_text()
        result = migrate_source(source, path.name, emulate=emulate)
        why = not_native([result.source], result.findings)
        todos = [f for f in result.findings if f.kind is Kind.TODO]
        if why is None and todos:
            why = f"{len(todos)} TODO(s)"
        rows.append({
            "file": str(path.relative_to(folder)),
            "native": why is None,
            "why": why,
            "optimizers": became(result.findings),
            "growth": len(result.source.splitlines()) - len(source.splitlines()),
            "helpers": HELPER.findall(result.source),
            "unused_named": "unused parameters keep grad None" in result.source,
            "source": result.source,
        })
    print(f"{'file':34} {'result':22} {'DistributedOptimizer':22} {'growth':>6}  helpers")
    for row in rows:
        result = "native" if row["native"] else f"not: {row['why']}"
        print(f"{row['file']:34} {result[:22]:22} {','.join(row['optimizers']) or '-':22} "
              f"{row['growth']:>6}  {' '.join(row['helpers']) or '-'}")
    native = [r for r in rows if r["native"]]
    with_opt = [r for r in rows if r["optimizers"]]
    averaged = [r for r in with_opt if all(k in ("DDP", "replicate") for k in r["optimizers"])]
    growth = statistics.median(r["growth"] for r in native) if native else float("nan")
    helpers = collections.Counter(h for r in rows for h in r["helpers"])
    version, api = torch_api.minimum_torch(r["source"] for r in rows)
    print()
    print(f"files: {len(rows)}" + (" (--emulate)" if emulate else ""))
    print(f"native: {len(native)} of {len(rows)} ({100 * len(native) / max(len(rows), 1):.0f} %; target >= 90 %)")
    print(f"with DistributedOptimizer: {len(with_opt)}; averaged by DDP or replicate: {len(averaged)} "
          f"({100 * len(averaged) / max(len(with_opt), 1):.0f} %; target >= 75 %)")
    print(f"median growth of a native file: {growth:g} lines (target <= 40)")
    print(f"outputs naming the unused-parameter difference (replicate, or DDP with find_unused_parameters): {sum(r['unused_named'] for r in rows)}")
    print(f"helpers pasted: {', '.join(f'{h} x{n}' for h, n in helpers.most_common()) or 'none'}")
    print(f"oldest torch the outputs need: {version} ({api})")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    emulate_option = "--emulate" in args
    folders = [a for a in args if a != "--emulate"]
    sys.exit(main(Path(folders[0]) if folders else ROOT / "tests" / "horovod_compat" / "migrate" / "corpus",
                  emulate_option))
