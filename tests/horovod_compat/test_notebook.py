"""The unchanged HorovodRunner notebook runs under a real Jupyter kernel (nbclient)."""
from __future__ import annotations

import ast
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).parents[2] / "examples" / "notebooks" / "horovodrunner_mnist.ipynb"


def _text_outputs(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def test_horovodrunner_notebook_runs_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3").execute()
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(not any(o.get("output_type") == "error" for o in c.get("outputs", [])) for c in code_cells)
    last = _text_outputs(code_cells[-1])
    assert "[rank 0] epoch 0: loss" in last and "[rank 0] epoch 1: loss" in last
    assert "[rank 1] epoch" not in last, "only rank 0 reports epochs"
    result = ast.literal_eval(last.strip().splitlines()[-1])
    assert result["size"] == 2
    assert result["accuracy"] > 0.9, result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-0.pt", "checkpoint-1.pt"]
