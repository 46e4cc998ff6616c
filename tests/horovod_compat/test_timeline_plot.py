"""The timeline plot people read: steady state by default (``view_window``), one row per tensor named
as Horovod names it (parameter names for a real 2-rank job's ``DistributedOptimizer`` and
``broadcast_parameters``), internal bookkeeping ops marked in the file and hidden unless asked,
step boundaries, the CLI's help and its one-line error without matplotlib."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from horovod_compat.timeline.__main__ import _parser
from horovod_compat.timeline.merge import merge_files
from horovod_compat.timeline.plot import view_window
from horovod_compat.timeline.reader import parse, summarize
from horovod_compat.timeline.writer import (INTERNAL_LABEL, STEP, TimelineRecorder, is_internal,
                                            mark_internal)
from warm import run_function_warm

REF = str(Path(__file__).resolve().parents[3] / "shared" / "reference" / "horovod_timeline")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 6


def _op(pid, name, neg_start, start, end, op="ALLREDUCE"):
    return [{"ph": "B", "name": f"NEGOTIATE_{op}", "ts": neg_start, "pid": pid},
            {"ph": "E", "ts": start, "pid": pid},
            {"ph": "B", "name": op, "ts": start, "pid": pid},
            {"ph": "E", "ts": end, "pid": pid, "args": {"dtype": "float32", "shape": "[4]"}}]


def _meta(pid, name, internal=False):
    ev = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}]
    if internal:
        ev.append({"name": "process_labels", "ph": "M", "pid": pid, "args": {"labels": INTERNAL_LABEL}})
    return ev


def _synthetic(with_steps=True):
    """The issue's shape: a 145 ms start-up negotiation, a broadcast, then 20 short steps."""
    ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    ev += _meta(1, "broadcast.fc.weight") + _op(1, "b", 1_000, 145_000, 146_000, "BROADCAST")
    ev += _meta(2, "allreduce.fc.weight") + _meta(3, "allreduce.DistributedOptimizer.0.check", True)
    ev += _op(3, "c", 150_000, 150_100, 150_200)
    for k in range(20):
        t = 150_000 + k * 1_000
        ev += _op(2, "g", t + 300, t + 400, t + 700)
        if with_steps:
            ev.append({"ph": "i", "name": "STEP", "ts": t + 800, "s": "g",
                       "args": {"step": k + 1, "optimizer": 0}})
    return ev


def test_view_window_excludes_start_up_by_default():
    ev = _synthetic()
    w = view_window(ev)
    assert (w.rule, w.start_us, w.end_us) == ("steps", 150_800, 169_800)   # end of step 1 .. the end
    assert view_window(ev, everything=True)[:2] == (1_000, 169_800)
    assert view_window(ev, from_ms=155, to_ms=160)[:3] == (155_000, 160_000, "range")
    assert view_window(ev, from_ms=160)[:2] == (160_000, 169_800)
    assert view_window(ev, steps=(3, 5))[:2] == (151_800, 154_800)        # end of step 2 .. end of 5
    assert view_window(ev, steps=(1, 1))[:2] == (1_000, 150_800)
    with pytest.raises(ValueError):
        view_window(ev, from_ms=160, to_ms=150)
    # without STEP marks: from the earliest second op of a tensor, its negotiation included
    plain = _synthetic(with_steps=False)
    w = view_window(plain)
    assert (w.rule, w.start_us) == ("repeated", 151_300)
    # the internal row repeats nothing and is not drawn: it never decides the window
    with pytest.raises(ValueError):
        view_window(plain, steps=(2, 3))
    # nothing repeats (Horovod's reference file): the whole timeline
    ref = json.load(open(os.path.join(REF, "tl.json")))
    assert view_window(ref).rule == "whole"
    dyn = json.load(open(os.path.join(REF, "dyn_rank0.json")))
    assert view_window(dyn)[:3] == (24_200, 32_114, "repeated")   # 2nd of three same_name ops


def test_writer_marks_internal_rows_and_steps_and_merge_keeps_them(tmp_path):
    mark_internal("Bookkeeping.x")
    assert is_internal("Bookkeeping.x") and not is_internal("grad")
    path = str(tmp_path / "t.json")
    rec = TimelineRecorder(path, rank=0, size=1, flush_ms=5)
    for name in ("grad", "Bookkeeping.x"):
        rec.listener("NEGOTIATE_START", name, {"kind": "allreduce"})
        rec.listener("ALL_READY", name, {})
        rec.listener("OP_START", name, {"kind": "allreduce", "dtype": "float32", "shape": (2,)})
        rec.listener("OP_END", name, {})
    rec.listener(STEP, "DistributedOptimizer.0", {"step": 1, "optimizer": 0})
    rec.close()
    ev = json.load(open(path))                          # valid JSON for chrome://tracing
    labels = [e for e in ev if e.get("name") == "process_labels"]
    assert len(labels) == 1 and labels[0]["args"] == {"labels": INTERNAL_LABEL}
    steps = [e for e in ev if e.get("name") == "STEP"]
    assert steps == [{"ph": "i", "name": "STEP", "ts": steps[0]["ts"], "s": "g",
                      "args": {"step": 1, "optimizer": 0}}]
    tl = parse(ev)
    assert {tl.processes[p] for p in tl.internal} == {"allreduce.Bookkeeping.x"}
    assert [a for _ts, _t, a in tl.steps] == [{"step": 1, "optimizer": 0}]
    assert list(summarize(ev)["tensors"]) == ["allreduce.grad"]
    assert summarize(ev)["internal_hidden"] == 1
    assert set(summarize(ev, internal=True)["tensors"]) == {"allreduce.grad", "allreduce.Bookkeeping.x"}
    merged = str(tmp_path / "m.json")
    merge_files([path], merged)
    assert {parse(json.load(open(merged))).processes[p] for p in
            parse(json.load(open(merged))).internal} == {"allreduce.Bookkeeping.x"}


def _train_job():
    import torch
    import horovod_compat.torch as hvd

    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(8, 16))
    model.add_module("act", torch.nn.ReLU())
    model.add_module("fc2", torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    same = [float(p.sum()) for p in model.parameters()]
    hvd.shutdown()
    return same


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tl") / "train.json")
    results = run_function_warm(_train_job, num_processes=2, return_all=True, timeout=180,
                           env={"HOROVOD_TIMELINE": path})
    return results, json.load(open(path)), path


def test_a_training_job_shows_parameter_names_and_marks_its_bookkeeping(trained):
    results, ev, _path = trained
    assert results[0] == results[1]                     # the broadcasts and reductions worked
    tl = parse(ev)
    shown = {tl.processes[p] for p in tl.processes if p not in tl.internal}
    params = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    # Horovod's rows: <op>.<name>; broadcast_optimizer_state: <state key>.<occurrence>
    assert shown == ({f"allreduce.{n}" for n in params} | {f"broadcast.{n}" for n in params}
                     | {f"broadcast.momentum_buffer.{i}" for i in range(1, 5)}), shown
    internal = {tl.processes[p] for p in tl.internal}
    assert {"allreduce.DistributedOptimizer.0.check", "allreduce.DistributedOptimizer.0.order",
            "allreduce.broadcast_parameters.layout", "broadcast.broadcast_parameters.fused0"} <= internal
    assert not any("noname" in n for n in shown | internal)
    per_row = Counter(tl.processes[s.pid] for s in tl.spans if s.depth == 0
                      and not s.name.startswith("NEGOTIATE_"))
    assert all(per_row[f"allreduce.{n}"] == STEPS for n in params), per_row
    assert all(per_row[f"broadcast.{n}"] == 1 for n in params), per_row
    # every rank's readiness tick reaches the per-parameter broadcast rows too
    ticks = {r for pid, _t, r, _ts in tl.ticks if tl.processes[pid] == "broadcast.fc1.weight"}
    assert ticks == {0, 1}
    # one STEP mark per optimizer step, numbered
    assert [a["step"] for _ts, _t, a in tl.steps] == list(range(1, STEPS + 1))
    s = summarize(ev)
    assert s["steps"] == STEPS and s["internal_hidden"] == len(internal)
    assert not any(t in s["tensors"] for t in internal)


def test_the_plot_of_a_training_job(trained, tmp_path):
    pytest.importorskip("matplotlib")
    from horovod_compat.timeline.plot import plot_gantt

    _results, ev, _path = trained
    tl = parse(ev)
    first_step_end = tl.steps[0][0]
    assert view_window(ev).start_us == first_step_end
    out = plot_gantt(ev, str(tmp_path / "d.png"))
    # the steady state: the gradients' rows only (the start-up broadcasts are left of the window),
    # one dashed line per step after the first
    assert sorted(out["rows"]) == sorted(f"allreduce.{n}" for n in
                                         ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    assert out["window"].rule == "steps" and out["steps"] == STEPS
    assert out["internal_hidden"] >= 4
    everything = plot_gantt(ev, str(tmp_path / "a.png"), everything=True, internal=True)
    rows = everything["rows"]
    assert "allreduce.DistributedOptimizer.0.check (internal)" in rows
    assert "broadcast.fc1.weight" in rows and "broadcast.momentum_buffer.1" in rows
    without = plot_gantt(ev, str(tmp_path / "b.png"), everything=True)["rows"]
    assert not any("internal" in r or "DistributedOptimizer" in r for r in without)
    assert without == [r for r in rows if not r.endswith(" (internal)")]
    for name in ("d.png", "a.png"):
        with open(tmp_path / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _cli(*args, blocker=False):
    env = dict(os.environ, PYTHONPATH=ROOT)
    code = "import runpy, sys; sys.argv = ['horovod_compat.timeline'] + sys.argv[1:]; "
    if blocker:
        # make `import matplotlib` fail as if it were not installed
        code += ("import importlib.abc\n"
                 "class Block(importlib.abc.MetaPathFinder):\n"
                 "    def find_spec(self, name, path=None, target=None):\n"
                 "        if name == 'matplotlib' or name.startswith('matplotlib.'):\n"
                 "            raise ModuleNotFoundError(\"No module named 'matplotlib'\")\n"
                 "sys.meta_path.insert(0, Block())\n")
    code += "\nrunpy.run_module('horovod_compat.timeline', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_without_matplotlib_says_how_to_install_it(tmp_path):
    ref = os.path.join(REF, "tl.json")
    for args in (["plot", ref, "-o", str(tmp_path / "x.png")],
                 ["summarize", ref, "--plot", str(tmp_path / "y.png")]):
        out = _cli(*args, blocker=True)
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert out.stderr.strip() == ("error: plotting needs matplotlib, which is not installed: "
                                      "pip install 'horovod-compat[plot]'"), out.stderr
        assert "pip install 'horovod-compat[plot]'" in out.stderr and "Traceback" not in out.stderr
    assert not os.path.exists(tmp_path / "x.png")
    # summarize itself does not need matplotlib
    out = _cli("summarize", ref, blocker=True)
    assert out.returncode == 0 and "ALLREDUCE" in out.stdout, out.stderr


def test_cli_plot_defaults_to_file_png_and_reports_the_window(trained, tmp_path):
    pytest.importorskip("matplotlib")
    _results, ev, _path = trained
    src = str(tmp_path / "job.json")
    json.dump(ev, open(src, "w"))
    out = _cli("plot", src)
    assert out.returncode == 0, out.stderr
    assert os.path.exists(str(tmp_path / "job.png"))
    assert "steady state from the end of training step 1" in out.stdout
    out = _cli("plot", src, "--all", "--steps", "2:3")
    assert out.returncode == 2 and "exclude each other" in out.stderr


def test_every_argument_of_every_command_is_explained():
    ap = _parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) == {"summarize", "plot", "merge"}
    for cmd, p in sub.choices.items():
        text = p.format_help()
        assert "example" in text, cmd                              # an epilog with examples
        for action in p._actions:
            if action.dest == "help":
                continue
            assert action.help and len(action.help) > 15, (cmd, action.dest)
            shown = action.option_strings[-1] if action.option_strings else action.metavar
            assert shown in text, (cmd, shown)
            assert " ".join(action.help.split()[:3]) in " ".join(text.split()), (cmd, action.dest)
    plot_help = " ".join(sub.choices["plot"].format_help().split())
    assert "timeline JSON file" in plot_help and "HOROVOD_TIMELINE" in plot_help
    assert "Default: FILE with its extension replaced by .png" in plot_help
    assert "STEADY STATE" in plot_help and "the end of training step 1" in plot_help
    top = _cli("--help")
    assert top.returncode == 0 and "COMMAND --help" in top.stdout
