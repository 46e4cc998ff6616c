"""Command line: ``python -m horovod_compat.migrate SRC... [-o OUT] [--diff] [--check] [-v]``.

* Without options, each changed file is rewritten in place; its original is kept beside it as
  ``FILE.orig`` (``.orig.1``, ... when that exists; ``--no-backup`` keeps none).
* ``-o OUT`` writes every input's result under OUT instead (a file path when there is a single
  input file and OUT is not an existing directory; otherwise a directory mirroring the inputs).
* ``--diff`` prints a unified diff and writes nothing (unless ``-o`` is also given).
* ``--check`` writes nothing, names each file that would be rewritten (with its counts) and
  exits 1 when any file would change or has a TODO (for CI).
* The report (TODOs with file:line, ``-v`` adds every rewrite) goes to stderr, with a table of
  the files (native or not, and why) when there are several or one is not native; with ``--format json`` a JSON
  document goes to stdout instead, one entry per file: whether it would change, whether its
  result is native, every rewrite and every TODO with its line (for CI; see ``json_report``).

Exit status: 0 every result is native (no TODO, no import of Horovod or of this project);
1 work is left for a person (a TODO, or a result that is not native; with ``--check``: also any
file that would change); 2 bad input (missing file, syntax error), which wins over 1.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional, Sequence, TextIO, Tuple

from horovod_compat.migrate import torch_api
from horovod_compat.migrate.engine import MigrationError, migrate_source
from horovod_compat.migrate.notebook import migrate_notebook, python_cells
from horovod_compat.migrate.report import Finding, Kind, write_report

_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".ipynb_checkpoints", "node_modules"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horovod-compat-migrate",
        description="Rewrite Horovod PyTorch code (import horovod.torch as hvd, HorovodRunner) "
        "into native torch.distributed / DistributedDataParallel code.",
    )
    parser.add_argument("sources", nargs="+", metavar="SRC", help=".py or .ipynb files, or directories")
    parser.add_argument("-o", "--output", metavar="OUT", help="write results here instead of in place")
    parser.add_argument("--no-backup", action="store_true",
                        help="rewriting in place, keep no FILE.orig copy of the original")
    parser.add_argument("--diff", action="store_true", help="print a unified diff; write nothing unless -o")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything would change or needs a TODO")
    parser.add_argument("-v", "--verbose", action="store_true", help="also list every rewrite in the report")
    parser.add_argument("--emulate", action="store_true",
                        help="where torch's data parallelism cannot take a DistributedOptimizer's model, "
                        "write _native_distributed_optimizer (Horovod's averaging in the optimizer, "
                        "identical numbers) instead of leaving a TODO")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="report format: text on stderr (default) or a JSON document on stdout")
    return parser


def json_report(files: List[dict], errors: List[str], status: int) -> str:
    """The ``--format json`` document: per file what changes and what needs a person."""
    summary = {
        "files": len(files),
        "native": sum(f["native"] for f in files),
        "would_change": sum(f["would_change"] for f in files),
        "rewrites": sum(len(f["rewrites"]) for f in files),
        "todos": sum(len(f["todos"]) for f in files),
        "errors": len(errors),
    }
    return json.dumps({"status": status, "summary": summary, "files": files, "errors": errors}, indent=2) + "\n"


#: Top-level packages whose import keeps a result from being native torch.distributed code.
NOT_NATIVE = ("horovod", "horovod_compat", "distributor", "sparkdl")


def not_native(sources: Sequence[str], findings: List[Finding]) -> Optional[str]:
    """Why a rewritten file (its Python `sources`: the file, or a notebook's cells) is not native
    yet, None when it is: a TODO is left, or it imports Horovod or this project (a result may
    rightly use ``distributor``: it says so)."""
    todos = sum(f.kind is Kind.TODO for f in findings)
    if todos:
        return f"{todos} TODO(s)"
    found = set()
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT  # a notebook cell may await
    trees = [compile(source, "<rewritten>", "exec", flags, dont_inherit=True) for source in sources]
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    left = sorted(found & set(NOT_NATIVE))
    return f"imports {', '.join(left)}" if left else None


def _file_record(path: Path, changed: bool, findings: List[Finding], why: Optional[str]) -> dict:
    def entry(f: Finding) -> dict:
        return {"location": f.location, "line": f.line, "name": f.name, "message": f.message}

    return {
        "path": str(path),
        "would_change": changed,
        "native": why is None,
        "not_native_because": why,
        "rewrites": [entry(f) for f in findings if f.kind is Kind.REWRITE],
        "todos": [entry(f) for f in findings if f.kind is Kind.TODO],
    }


def backup_path(path: Path) -> Path:
    """``FILE.orig``, or the first free ``FILE.orig.N``."""
    candidate = path.with_name(path.name + ".orig")
    n = 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.orig.{n}")
    return candidate


def _summary(records: List[dict], stream: TextIO) -> None:
    """One line per file: native or why not, with its counts."""
    width = max(len(r["path"]) for r in records)
    stream.write(f"{'file':<{width}}  rewrites  TODOs  result\n")
    for r in records:
        result = "native" if r["native"] else f"not native: {r['not_native_because']}"
        stream.write(f"{r['path']:<{width}}  {len(r['rewrites']):>8}  {len(r['todos']):>5}  {result}\n")
    native = sum(r["native"] for r in records)
    stream.write(f"{native} of {len(records)} file(s) native\n")


def collect_sources(sources: Sequence[str]) -> List[Tuple[Path, Path]]:
    """``(file, path relative to its SRC argument)`` for every input file.

    Raises FileNotFoundError naming a SRC that does not exist.
    """
    files: List[Tuple[Path, Path]] = []
    for source in sources:
        path = Path(source)
        if path.is_file():
            files.append((path, Path(path.name)))
        elif path.is_dir():
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
                for name in sorted(names):
                    if name.endswith((".py", ".ipynb")):
                        full = Path(root) / name
                        files.append((full, full.relative_to(path)))
        elif path.exists():
            raise FileNotFoundError(f"{source}: not a regular file or directory")
        else:
            raise FileNotFoundError(f"{source}: no such file or directory")
    return files


def migrate_file(path: Path, text: str, emulate: bool = False
                 ) -> Tuple[str, List[Finding], List[Tuple[str, str, str]]]:
    """Rewrite one file's text: (new text, findings, [(label, old, new)] pieces to diff)."""
    location = str(path)
    if path.suffix == ".ipynb":
        new_text, results, indices = migrate_notebook(text, location, emulate)
        findings = [f for r in results for f in r.findings]
        pieces = [(f"{location}[cell {i}]", r.original, r.source) for i, r in zip(indices, results) if r.changed]
        return new_text, findings, pieces
    result = migrate_source(text, location, emulate)
    return result.source, result.findings, [(location, text, result.source)] if result.changed else []


def _output_path(out: Path, rel: Path, single_file: bool) -> Path:
    if single_file and not out.is_dir():
        return out
    return out / rel


def _diff(label: str, old: str, new: str, stream: TextIO) -> None:
    label = label.lstrip("/")
    for line in difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{label}", f"b/{label}"
    ):
        stream.write(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")


def main(argv: Optional[Sequence[str]] = None, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    as_json = args.format == "json"
    if as_json and args.diff:
        parser.error("--format json writes the report to stdout; it cannot be combined with --diff")
    try:
        files = collect_sources(args.sources)
    except FileNotFoundError as err:
        stderr.write(f"horovod-compat-migrate: error: {err.args[0]}\n")
        if as_json:
            stdout.write(json_report([], [err.args[0]], 2))
        return 2
    single_file = len(args.sources) == 1 and Path(args.sources[0]).is_file()
    out = Path(args.output) if args.output else None
    status = 0
    all_findings: List[Finding] = []
    records: List[dict] = []
    errors: List[str] = []
    would_change = False
    work_left = False
    backups: List[Path] = []
    outputs: List[str] = []
    for path, rel in files:
        try:
            text = path.read_text(encoding="utf-8")
            new_text, findings, pieces = migrate_file(path, text, args.emulate)
        except (MigrationError, UnicodeDecodeError) as err:
            stderr.write(f"horovod-compat-migrate: error: {err}\n")
            errors.append(str(err))
            status = 2
            continue
        all_findings += findings
        changed = new_text != text
        sources = python_cells(new_text, str(path)) if path.suffix == ".ipynb" else [new_text]
        outputs += sources
        why = not_native(sources, findings)
        records.append(_file_record(path, changed, findings, why))
        would_change |= changed or any(f.kind is Kind.TODO for f in findings)
        work_left |= why is not None
        if args.diff:
            for label, old, new in pieces:
                _diff(label, old, new, stdout)
        if args.check:
            if changed and not as_json:
                record = records[-1]
                stderr.write(f"{path}: would be rewritten ({len(record['rewrites'])} rewrite(s), "
                             f"{len(record['todos'])} TODO(s))\n")
            continue
        if out is not None:
            target = _output_path(out, rel, single_file)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(new_text, encoding="utf-8")
        elif changed and not args.diff:
            if not args.no_backup:
                backup = backup_path(path)
                shutil.copy2(path, backup)
                backups.append(backup)
            path.write_text(new_text, encoding="utf-8")
    if status == 0 and (work_left or (args.check and would_change)):
        status = 1
    if as_json:
        stdout.write(json_report(records, errors, status))
    else:
        write_report(all_findings, stderr, verbose=args.verbose)
        if would_change:
            version, api = torch_api.minimum_torch(outputs)
            stderr.write(f"horovod-compat-migrate: the output needs torch >= {version} ({api}; "
                         "migration_guide/torch_apis.md)\n")
        for backup in backups:
            stderr.write(f"horovod-compat-migrate: the original is kept as {backup}\n")
        if len(records) > 1 or any(not r["native"] for r in records):
            _summary(records, stderr)  # so a non-native result always says why
    return status
