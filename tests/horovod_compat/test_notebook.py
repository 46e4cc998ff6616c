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


FAILING_CELL = '''\
import horovod.torch as hvd


def train():
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad cell data on rank 1")  # the failing line of the cell
    return hvd.rank()
'''


def test_a_failing_cell_function_shows_its_cell_line_on_the_driver():
    """A function defined in a notebook cell travels by value; when it raises on a rank, the
    error the notebook shows names the cell's file (IPython's name for it) and line and quotes
    the cell's source line, though the rank process never saw the cell."""
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(FAILING_CELL),
        nbformat.v4.new_code_cell("from sparkdl import HorovodRunner\n"
                                  "HorovodRunner(np=-2).run(train)"),
    ])
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", allow_errors=True).execute()
    assert not any(o.get("output_type") == "error" for o in notebook.cells[0].outputs)
    errors = [o for o in notebook.cells[1].outputs if o.get("output_type") == "error"]
    assert len(errors) == 1, notebook.cells[1].outputs
    message = errors[0]["evalue"]
    assert "Traceback from rank 1:" in message, message
    assert 'raise ValueError("bad cell data on rank 1")  # the failing line of the cell' in message
    cell_frame = next(line for line in message.splitlines() if line.strip().endswith(", in train"))
    assert cell_frame.strip().startswith('File "') and "line 7" in cell_frame, cell_frame
    assert "<dynamic-code>" not in message
