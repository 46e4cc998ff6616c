"""Jupyter/Databricks ``.ipynb`` notebooks: rewrite the code cells, leave everything else intact.

Cells share one namespace, so all code cells are rewritten together (see engine.py).  IPython
line magics and shell escapes (``%pip install ...``, ``!nvidia-smi``) are not Python: they are
swapped for placeholder comments while libcst parses the cell and put back afterwards.  Cells
whose first line is a cell magic (``%%bash``) or a Databricks language magic (``%md``, ``%sh``,
``%sql``, ...) are not Python at all and are skipped.
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Tuple

from horovod_compat.migrate.engine import MigrationError, Unit, UnitResult, migrate_units

_NON_PYTHON = re.compile(r"^\s*(%%|%(md|sh|sql|scala|r|fs|run|python)\b)")
_MAGIC = re.compile(r"^(\s*)([%!].*)$")
_PLACEHOLDER = re.compile(r"^(\s*)# __horovod_compat_magic_(\d+)__$")


def _cell_text(cell: Dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _mask(text: str) -> Tuple[str, List[str]]:
    """Replace magic lines by numbered placeholder comments (same indentation)."""
    magics: List[str] = []
    out = []
    for line in text.split("\n"):
        match = _MAGIC.match(line)
        if match:
            out.append(f"{match.group(1)}# __horovod_compat_magic_{len(magics)}__")
            magics.append(match.group(2))
        else:
            out.append(line)
    return "\n".join(out), magics


def _unmask(text: str, magics: List[str]) -> str:
    lines = []
    for line in text.split("\n"):
        match = _PLACEHOLDER.match(line)
        if match and int(match.group(2)) < len(magics):
            line = match.group(1) + magics[int(match.group(2))]
        lines.append(line)
    return "\n".join(lines)


def load_notebook(text: str, location: str) -> Dict[str, Any]:
    """Parse notebook JSON, with a clear error when it is not a notebook."""
    try:
        notebook = json.loads(text)
    except json.JSONDecodeError as err:
        raise MigrationError(f"{location}:{err.lineno}:{err.colno}: not valid notebook JSON: {err.msg}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise MigrationError(f"{location}: not a Jupyter notebook (no 'cells' list)")
    return notebook


def python_cells(text: str, location: str) -> List[str]:
    """The Python of a notebook's code cells, magics masked (what `migrate_notebook` rewrites)."""
    cells = [_cell_text(c) for c in load_notebook(text, location)["cells"] if c.get("cell_type") == "code"]
    return [_mask(source)[0] for source in cells if not _NON_PYTHON.match(source)]


def migrate_notebook(text: str, location: str, emulate: bool = False) -> Tuple[str, List[UnitResult], List[int]]:
    """Rewrite a notebook's code cells.

    Returns the new notebook text (the input text itself when nothing changed, so untouched
    notebooks stay byte-identical), the per-cell results, and the cell indices they belong to.
    """
    notebook = load_notebook(text, location)
    units: List[Unit] = []
    indices: List[int] = []
    masks: List[List[str]] = []
    originals: List[str] = []
    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "code":
            continue
        source = _cell_text(cell)
        if _NON_PYTHON.match(source):
            continue
        masked, magics = _mask(source)
        units.append(Unit(masked, f"{location}[cell {index}]"))
        indices.append(index)
        masks.append(magics)
        originals.append(source)
    results = migrate_units(units, emulate)
    if not any(r.changed for r in results):
        return text, results, indices
    for index, result, magics, original in zip(indices, results, masks, originals):
        if not result.changed:
            continue
        cell = notebook["cells"][index]
        new_text = _unmask(result.source, magics)
        if isinstance(cell.get("source"), list):
            cell["source"] = new_text.splitlines(keepends=True)
        else:
            cell["source"] = new_text
        # Results carry the real cell text (magics back in place) so diffs show what is written.
        result.source = new_text
        result.original = original
    indent = 1
    match = re.search(r'^\{\n( +)"', text)
    if match:
        indent = len(match.group(1))
    return json.dumps(notebook, indent=indent, ensure_ascii=False) + "\n", results, indices
