"""HorovodRunner notebooks under a real Jupyter kernel (nbclient).

The unchanged example notebook (examples/notebooks/horovodrunner_mnist.ipynb) runs in
tests/horovod_compat/migrate/test_migrate_notebook_e2e.py, which checks its own promises (no cell
error, rank 0 alone reports its epochs, 2 ranks, accuracy > 0.9, exactly the two checkpoints)
before it compares the rewritten notebook with it: one kernel run of it for both.
"""
from __future__ import annotations

import nbclient
import nbformat

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
