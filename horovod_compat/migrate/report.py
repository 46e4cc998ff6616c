"""What the rewriter tells its user: one `Finding` per rewrite or per place it refused to touch.

Findings carry the line number in the *input* file, so a `--check` run in CI (which writes
nothing) points at lines that exist.  TODO findings are also written into the output as
``# TODO(horovod-compat): ...`` comments, so they survive into the rewritten file.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Iterable, List, TextIO

TODO_MARKER = "TODO(horovod-compat)"


class Kind(enum.Enum):
    """A finding is either a rewrite that was made, or a TODO left for a person."""

    REWRITE = "rewrite"
    TODO = "todo"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One rewrite or TODO, located in the input.

    `location` is a display path: a file path, or ``notebook.ipynb[cell 3]`` for notebooks.
    `line` is 1-based within that file or cell.
    """

    location: str
    line: int
    kind: Kind
    name: str
    message: str

    def format(self) -> str:
        """Render as ``path:line: TODO hvd.allgather: why`` (compiler-style, clickable)."""
        label = "TODO" if self.kind is Kind.TODO else "rewrote"
        return f"{self.location}:{self.line}: {label} {self.name}: {self.message}"


def todo_comment(name: str, message: str) -> str:
    """The comment text inserted above a statement the rewriter left in place."""
    return f"# {TODO_MARKER}: {name}: {message}"


def write_report(findings: Iterable[Finding], stream: TextIO, verbose: bool = False) -> None:
    """Print TODO findings and what each DistributedOptimizer became (always) and the other
    rewrites (when `verbose`) to `stream`, then a summary."""
    findings = list(findings)
    todos: List[Finding] = [f for f in findings if f.kind is Kind.TODO]
    rewrites: List[Finding] = [f for f in findings if f.kind is Kind.REWRITE]
    for finding in findings:
        # what each DistributedOptimizer became (DDP, in place, the fallback) and why: always
        if finding.kind is Kind.TODO or verbose or finding.name == "hvd.DistributedOptimizer":
            stream.write(finding.format() + "\n")
    stream.write(
        f"horovod-compat-migrate: {len(rewrites)} rewrite(s), "
        f"{len(todos)} TODO(s) left for a person\n"
    )
