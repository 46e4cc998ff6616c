"""The command line: in place, -o, --diff, --check, notebooks, and errors for bad input."""
import io
import json
import subprocess
import sys
from pathlib import Path


from horovod_compat.migrate.cli import main

HVD_SCRIPT = """\
import torch
import horovod.torch as hvd

hvd.init()
print(hvd.rank(), hvd.size())
"""
FLAGGED_SCRIPT = """\
import torch
import horovod.torch as hvd

hvd.init()
parts = hvd.alltoall(torch.ones(hvd.rank() + 1))
"""
NATIVE_SCRIPT = "import torch.distributed as dist\nprint(dist.get_rank())\n"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    status = main([str(a) for a in argv], stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def test_rewrites_in_place_and_reports(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    status, out, err = run(script)
    assert status == 0 and out == ""
    text = script.read_text()
    assert "horovod" not in text
    assert "print(dist.get_rank(), dist.get_world_size())" in text
    assert "2 rewrite(s), 0 TODO(s)" in err or "rewrite(s), 0 TODO(s)" in err


def test_todo_is_reported_with_file_and_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FLAGGED_SCRIPT)
    status, _, err = run(script)
    assert status == 1  # work is left for a person
    assert f"{script}:5: TODO hvd.alltoall:" in err
    text = script.read_text()
    assert "# TODO(horovod-compat): hvd.alltoall:" in text
    assert "import horovod.torch as hvd" in text  # still used, so still imported


def test_verbose_lists_rewrites(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    _, _, err = run("-v", script)
    assert f"{script}:4: rewrote hvd.init:" in err
    assert f"{script}:5: rewrote hvd.rank:" in err


def test_check_fails_without_writing_when_work_remains(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    status, out, err = run("--check", script)
    assert status == 1 and out == ""
    assert f"{script}: would be rewritten (" in err and ", 0 TODO(s))" in err
    assert script.read_text() == HVD_SCRIPT


def test_check_fails_on_a_file_with_only_todos_left(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FLAGGED_SCRIPT)
    assert run(script)[0] == 1  # rewrite what can be rewritten; a TODO is left
    status, _, err = run("--check", script)
    assert status == 1 and "TODO hvd.alltoall" in err


def test_check_passes_on_native_code(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NATIVE_SCRIPT)
    assert run("--check", script)[0] == 0


def test_diff_prints_and_does_not_write(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    status, out, _ = run("--diff", script)
    assert status == 0
    assert out.startswith(f"--- a/{str(script).lstrip('/')}\n+++ b/")
    assert "-import horovod.torch as hvd\n" in out
    assert "+print(dist.get_rank(), dist.get_world_size())\n" in out
    assert script.read_text() == HVD_SCRIPT


def test_output_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    target = tmp_path / "out" / "native.py"
    assert run(script, "-o", target)[0] == 0
    assert script.read_text() == HVD_SCRIPT
    assert "dist.get_rank()" in target.read_text()


def test_output_directory_mirrors_a_source_tree(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "train.py").write_text(HVD_SCRIPT)
    (src / "native.py").write_text(NATIVE_SCRIPT)
    (src / "notes.txt").write_text("not python")
    out = tmp_path / "out"
    assert run(src, "-o", out)[0] == 0
    assert "dist.get_world_size()" in (out / "pkg" / "train.py").read_text()
    assert (out / "native.py").read_text() == NATIVE_SCRIPT  # copied unchanged, tree complete
    assert not (out / "notes.txt").exists()
    assert (src / "pkg" / "train.py").read_text() == HVD_SCRIPT


def test_missing_file_is_a_clear_error(tmp_path):
    status, _, err = run(tmp_path / "nope.py")
    assert status == 2
    assert f"{tmp_path / 'nope.py'}: no such file or directory" in err


def test_syntax_error_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import horovod.torch as hvd\n\ndef f(:\n    pass\n")
    good = tmp_path / "good.py"
    good.write_text(HVD_SCRIPT)
    status, _, err = run(bad, good)
    assert status == 2
    assert f"{bad}:3:" in err and "syntax error" in err
    assert bad.read_text().startswith("import horovod.torch as hvd")
    assert "dist.get_rank()" in good.read_text()  # other files are still processed


def _notebook(cells):
    return {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}, "custom": {"keep": [1, 2]}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _code(lines, outputs=()):
    return {"cell_type": "code", "execution_count": 1, "metadata": {"tags": ["x"]},
            "outputs": list(outputs), "source": lines}


def _write_nb(path, nb):
    path.write_text(json.dumps(nb, indent=1) + "\n")


def test_notebook_code_cells_rewritten_rest_intact(tmp_path):
    output = {"output_type": "stream", "name": "stdout", "text": ["0\n"]}
    nb = _notebook([
        {"cell_type": "markdown", "metadata": {}, "source": ["Call `hvd.init()` first\n"]},
        _code(["%pip install torch\n", "import horovod.torch as hvd\n"]),
        _code(["hvd.init()\n", "!nvidia-smi\n", "print(hvd.rank())"], [output]),
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["%sh\n", "ls -l hvd.init()\n"]},
    ])
    path = tmp_path / "train.ipynb"
    _write_nb(path, nb)
    status, _, err = run(path)
    assert status == 0, err
    new = json.loads(path.read_text())
    assert new["metadata"] == nb["metadata"] and new["nbformat"] == 4
    assert new["cells"][0] == nb["cells"][0]  # markdown untouched
    assert new["cells"][3] == nb["cells"][3]  # %sh cell is not Python: untouched
    first = "".join(new["cells"][1]["source"])
    assert first.startswith("%pip install torch\n")  # magic restored
    assert "horovod" not in first and "import torch.distributed as dist" in first
    second = new["cells"][2]
    assert "!nvidia-smi\n" in second["source"]
    assert "print(dist.get_rank())" in "".join(second["source"])
    assert second["outputs"] == [output] and second["metadata"] == {"tags": ["x"]}


def test_notebook_keeps_hvd_import_used_in_another_cell(tmp_path):
    nb = _notebook([
        _code(["import horovod.torch as hvd\n"]),
        _code(["hvd.init()\n", "x = hvd.alltoall(t)\n"]),
    ])
    path = tmp_path / "nb.ipynb"
    _write_nb(path, nb)
    status, _, err = run(path)
    assert status == 1
    new = json.loads(path.read_text())
    assert "import horovod.torch as hvd" in "".join(new["cells"][0]["source"])
    assert f"{path}[cell 1]:2: TODO hvd.alltoall" in err


def test_notebook_model_used_in_another_cell_is_made_data_parallel_in_place(tmp_path):
    nb = _notebook([
        _code(["import torch\n", "import horovod.torch as hvd\n", "model = torch.nn.Linear(1, 1)\n",
               "opt = torch.optim.SGD(model.parameters(), lr=1.0)\n",
               "opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())\n"]),
        _code(["loss = model(torch.ones(1)).sum()\n"]),
    ])
    path = tmp_path / "nb.ipynb"
    _write_nb(path, nb)
    status, _, err = run(path)  # (what the optimizer became is reported without -v)
    assert status == 0, err
    # no DDP wrap (the forward pass in cell 1 could not be redirected to it): the module object
    # itself becomes data-parallel, so cell 1, unchanged, averages the gradients too
    assert "-> replicate(model) before this line" in err
    assert "not DDP because `model` is also used in another notebook cell" not in err  # (the wrap's own reason, -v)
    new = json.loads(path.read_text())
    first = "".join(new["cells"][0]["source"])
    assert "replicate(model, find_unused_parameters=True)" in first and "\nopt = opt\n" not in first
    assert "DDP(" not in first and "_native_distributed_optimizer" not in first
    assert new["cells"][1] == nb["cells"][1]


def test_untouched_notebook_is_byte_identical(tmp_path):
    path = tmp_path / "plain.ipynb"
    text = json.dumps(_notebook([_code(["print(1)\n"])]), indent=2)  # no trailing newline, indent 2
    path.write_text(text)
    assert run(path)[0] == 0
    assert path.read_text() == text


def test_notebook_diff_is_per_cell(tmp_path):
    path = tmp_path / "nb.ipynb"
    _write_nb(path, _notebook([_code(["import horovod.torch as hvd\n", "hvd.init()\n"])]))
    status, out, _ = run("--diff", path)
    assert status == 0 and "nb.ipynb[cell 0]" in out and "-hvd.init()" in out


def test_invalid_notebook_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.ipynb"
    path.write_text("{not json")
    status, _, err = run(path)
    assert status == 2 and f"{path}:1:2: not valid notebook JSON" in err


def test_python_dash_m_entry_point(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "horovod_compat.migrate", "--check", str(script)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3], timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "rewrite(s)" in proc.stderr


def test_a_name_the_input_binds_otherwise_is_left_to_it_and_ours_takes_a_free_one(tmp_path):
    script = tmp_path / "train.py"
    source = ("import torch\nimport pyro.distributions as dist\nimport horovod.torch as hvd\n"
              "hvd.init()\nprior = dist.Normal(0, 1)\n"
              "def f(dist=None):\n    return dist, hvd.rank()\nf(dist=prior)\n")
    script.write_text(source)
    status, _, err = run(script)
    assert status == 0, err
    text = script.read_text()
    assert "import pyro.distributions as dist\n" in text and "prior = dist.Normal(0, 1)" in text
    assert "import torch.distributed as torch_dist\n" in text
    assert "torch_dist.init_process_group(" in text
    assert "def f(dist=None):\n    return dist, torch_dist.get_rank()\nf(dist=prior)" in text
    assert "horovod" not in text


def test_from_import_of_another_torch_distributor_is_left_to_it(tmp_path):
    """`from m import X` binds X (not m): a TorchDistributor of the user's own is not ours to call."""
    script = tmp_path / "launch.py"
    source = ("from sparkdl import HorovodRunner\nfrom mylib.launch import TorchDistributor\n"
              "def train(lr):\n    return lr\nHorovodRunner(np=2).run(train, lr=0.1)\n")
    script.write_text(source)
    status, _, err = run(script)
    assert status == 0, err
    text = script.read_text()
    assert "from mylib.launch import TorchDistributor\n" in text
    assert "from pyspark.ml.torch.distributor import TorchDistributor as TorchDistributor_\n" in text
    assert "TorchDistributor_(" in text and "sparkdl" not in text


def test_notebook_model_created_in_another_cell_is_made_data_parallel_in_place(tmp_path):
    nb = _notebook([
        _code(["import torch\n", "model = torch.nn.Linear(1, 1)\n"]),
        _code(["def train():\n", "    import horovod.torch as hvd\n",
               "    opt = torch.optim.SGD(model.parameters(), lr=1.0)\n",
               "    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())\n",
               "    model(torch.ones(1)).sum().backward()\n"]),
    ])
    path = tmp_path / "nb.ipynb"
    _write_nb(path, nb)
    status, _, err = run("-v", path)
    assert status == 0, err
    assert f"{path}[cell 1]:4: rewrote hvd.DistributedOptimizer: -> replicate(model) before this line" in err
    cell = "".join(json.loads(path.read_text())["cells"][1]["source"])
    assert "    replicate(model, find_unused_parameters=True)" in cell and "opt = opt" not in cell


def test_check_json_reports_per_file_what_changes_and_what_needs_a_person(tmp_path):
    (tmp_path / "a_rewritable.py").write_text(HVD_SCRIPT)
    (tmp_path / "b_flagged.py").write_text(FLAGGED_SCRIPT)
    (tmp_path / "c_native.py").write_text(NATIVE_SCRIPT)
    status, out, err = run("--check", "--format", "json", tmp_path)
    assert status == 1 and err == ""
    report = json.loads(out)
    assert report["status"] == 1
    files = {Path(f["path"]).name: f for f in report["files"]}
    assert files["a_rewritable.py"]["would_change"] and files["a_rewritable.py"]["todos"] == []
    assert {r["name"] for r in files["a_rewritable.py"]["rewrites"]} >= {"hvd.init", "hvd.rank", "hvd.size"}
    assert [(t["line"], t["name"]) for t in files["b_flagged.py"]["todos"]] == [(5, "hvd.alltoall")]
    assert "all_to_all_single" in files["b_flagged.py"]["todos"][0]["message"]
    assert files["c_native.py"] == {"path": str(tmp_path / "c_native.py"), "would_change": False,
                                    "native": True, "not_native_because": None,
                                    "rewrites": [], "todos": []}
    assert files["a_rewritable.py"]["native"] and not files["b_flagged.py"]["native"]
    assert files["b_flagged.py"]["not_native_because"] == "1 TODO(s)"
    assert report["summary"] == {"files": 3, "native": 2, "would_change": 2,
                                 "rewrites": report["summary"]["rewrites"], "todos": 1, "errors": 0}
    assert (tmp_path / "a_rewritable.py").read_text() == HVD_SCRIPT  # --check writes nothing


def test_in_place_keeps_the_original_beside_the_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    (tmp_path / "train.py.orig").write_text("an older backup\n")
    status, _, err = run(script)
    assert status == 0
    assert (tmp_path / "train.py.orig.1").read_text() == HVD_SCRIPT  # the older one is kept too
    assert (tmp_path / "train.py.orig").read_text() == "an older backup\n"
    assert f"the original is kept as {tmp_path / 'train.py.orig.1'}" in err
    other = tmp_path / "other.py"
    other.write_text(HVD_SCRIPT)
    assert run("--no-backup", other)[0] == 0
    assert not (tmp_path / "other.py.orig").exists() and "horovod" not in other.read_text()


def test_many_files_end_with_a_table_of_what_is_native(tmp_path):
    (tmp_path / "a.py").write_text(HVD_SCRIPT)
    (tmp_path / "b.py").write_text(FLAGGED_SCRIPT)
    (tmp_path / "c.py").write_text("import distributor\ndistributor.run_function(print, num_processes=2)\n")
    (tmp_path / "d.py").write_text("import horovod\nhorovod.run(print, np=2)\n")  # -> torch's launcher
    status, _, err = run("-o", tmp_path / "out", tmp_path)
    assert status == 1
    rows = {line.split()[0]: line for line in err.splitlines() if line.startswith(str(tmp_path))}
    assert rows[str(tmp_path / "a.py")].endswith("  native")
    assert rows[str(tmp_path / "b.py")].endswith("not native: 1 TODO(s)")
    assert rows[str(tmp_path / "c.py")].endswith("not native: imports distributor")
    assert rows[str(tmp_path / "d.py")].endswith("  native")
    assert "2 of 4 file(s) native" in err


def test_a_notebook_that_imports_this_project_is_not_native(tmp_path):
    """Its cells are checked for imports like a .py file (magics and top-level await allowed)."""
    nb = _notebook([
        _code(["%pip install torch\n", "from distributor import TorchDistributor\n"]),
        _code(["def train():\n", "    return 1\n", "TorchDistributor(num_processes=2).run(train)\n"]),
        _code(["await asyncio.sleep(0)\n"]),
    ])
    path = tmp_path / "launch.ipynb"
    _write_nb(path, nb)
    status, out, _ = run("--check", "--format", "json", path)
    record = json.loads(out)["files"][0]
    assert status == 1 and record["native"] is False
    assert record["not_native_because"] == "imports distributor" and record["todos"] == []


def test_check_json_on_native_code_passes_and_bad_input_is_listed(tmp_path):
    (tmp_path / "native.py").write_text(NATIVE_SCRIPT)
    status, out, _ = run("--check", "--format", "json", tmp_path)
    assert status == 0 and json.loads(out)["summary"]["would_change"] == 0
    (tmp_path / "broken.py").write_text("def f(:\n")
    status, out, _ = run("--check", "--format", "json", tmp_path)
    report = json.loads(out)
    assert status == 2 and report["status"] == 2
    assert len(report["errors"]) == 1 and "broken.py:1" in report["errors"][0]
    status, out, _ = run("--format", "json", tmp_path / "missing.py")
    assert status == 2 and "no such file" in json.loads(out)["errors"][0]


def test_json_format_refuses_diff(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(HVD_SCRIPT)
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        run("--diff", "--format", "json", script)
    assert exit_info.value.code == 2
    assert "cannot be combined with --diff" in capsys.readouterr().err


KWARGS_SCRIPT = """\
import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 1)
options = {"backward_passes_per_step": 1}
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **options)
model(torch.ones(2, 4)).sum().backward()
opt.step()
"""


def test_emulation_only_when_asked(tmp_path):
    """Options as **kwargs: torch's data parallelism cannot take the optimizer. By default it stays,
    with a TODO that says why and names --emulate, and the file is not native (exit 1); with
    --emulate it becomes _native_distributed_optimizer and the file is native (exit 0)."""
    script = tmp_path / "train.py"
    script.write_text(KWARGS_SCRIPT)
    status, _, err = run(script, "-o", tmp_path / "default.py")
    default = (tmp_path / "default.py").read_text()
    assert status == 1, err
    assert "TODO hvd.DistributedOptimizer" in err and "**kwargs" in err and "--emulate" in err
    assert "hvd.DistributedOptimizer(" in default and "_native_distributed_optimizer(" not in default
    status, _, err = run(script, "--emulate", "-o", tmp_path / "emulated.py")
    emulated = (tmp_path / "emulated.py").read_text()
    assert status == 0, err
    assert "horovod" not in emulated and "opt = _native_distributed_optimizer(" in emulated
