"""Horovod's own PyTorch example scripts (0.28.1), rewritten by the migrate tool.

For every script: the rewrite imports no Horovod and leaves no TODO where a native equivalent
exists, compiles, and is a fixed point (rewriting it again changes nothing).  End to end, for the
scripts whose data can be synthesised here: the rewritten script run on 2 ranks under the torchrun
contract prints the same per-epoch metrics as the unchanged script on the horovod-compat shim.

The scripts are read from ../shared/upstream (HOROVOD_UPSTREAM_DIR overrides); nothing of them is
committed here, and the tests skip with the reason when they are absent.
"""
from __future__ import annotations

import ast
import functools
import os
import shutil
from pathlib import Path

import pytest

from horovod_compat.migrate import Kind, migrate_source
from horovod_compat.migrate.report import TODO_MARKER
from upstream import (
    MISSING,
    ROOT,
    SCRIPTS,
    UPSTREAM,
    assert_same_metrics,
    metrics,
    run_ranks,
    upstream_present,
    write_mnist,
)
from tiers import CI

pytestmark = pytest.mark.skipif(not upstream_present(), reason=MISSING)

#: TODOs a script may keep, by name, and why: only where nothing native exists.
ALLOWED_TODOS = {
    # Lightning 2 removed these hooks (or stopped calling them); Horovod's Lightning support ended
    # with Lightning 1, so they have no native stack to run on.
    "examples/pytorch/pytorch_lightning_mnist.py": {"validation_epoch_end", "on_epoch_end", "on_init_start",
                                                    "on_init_end"},
}


@functools.lru_cache(maxsize=None)
def _rewrite(script: str):
    """The rewriter's result for `script`, made once per run: several tests read it (a rewrite
    of one of these scripts costs 0.4-1 s of CPU), none changes it."""
    path = UPSTREAM / script
    return migrate_source(path.read_text(), path.name)


def _imports(source: str):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module or ""


@pytest.mark.parametrize("script", SCRIPTS)
def test_upstream_script_becomes_native(script):
    result = _rewrite(script)
    compile(result.source, script, "exec")
    horovod = [m for m in _imports(result.source) if m.split(".")[0] == "horovod"]
    assert horovod == [], f"{script} still imports {horovod}"
    assert "'horovod'" not in result.source and '"horovod"' not in result.source  # Trainer(accelerator=)
    todos = {f.name for f in result.findings if f.kind is Kind.TODO}
    assert todos <= ALLOWED_TODOS.get(script, set()), [
        f.format() for f in result.findings if f.kind is Kind.TODO]
    assert result.source.count(TODO_MARKER) == len([f for f in result.findings if f.kind is Kind.TODO])


@pytest.mark.parametrize("script", SCRIPTS)
def test_rewriting_an_upstream_script_twice_changes_nothing(script):
    once = _rewrite(script).source
    assert migrate_source(once, Path(script).name).source == once


MNIST_ARGS = ["--epochs", "1", "--batch-size", "16", "--test-batch-size", "20", "--log-interval", "1"]


def test_pytorch_mnist_rewritten_trains_like_the_unchanged_script_on_the_shim(tmp_path):
    """Same train-loss lines (every batch) and test loss/accuracy as the unchanged script."""
    data = write_mnist(tmp_path / "data")
    native = tmp_path / "pytorch_mnist_native.py"
    native.write_text(_rewrite("examples/pytorch/pytorch_mnist.py").source)
    argv = MNIST_ARGS + ["--data-dir", str(data)]
    env = {"HOME": str(tmp_path)}  # the script takes a FileLock on ~/.horovod_lock
    prefixes = ("Train Epoch", "Test set")
    got = metrics(run_ranks(native, argv, env), prefixes)
    want = metrics(run_ranks(UPSTREAM / "examples/pytorch/pytorch_mnist.py", argv, env), prefixes)
    assert any(line.startswith("Test set") for line in want)
    assert_same_metrics(got, want)
    # --num-proc 2: the script's own launcher path, horovod.run -> torch's elastic_launch, whose
    # ranks print to the one stdout unprefixed: rank 0's lines are among them, and rank 1's
    # "Train Epoch" lines beside (the "Test set" ones are rank 0's only)
    import re
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(native), "--num-proc", "2"] + argv, cwd=tmp_path,
                          env={**os.environ, **env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = metrics(proc.stdout.splitlines(), prefixes)
    test_lines = [line for line in want if line.startswith("Test set")]
    assert_same_metrics([line for line in both if line.startswith("Test set")], test_lines)
    # (a print's text and its newline are two writes: one rank's line may run into the other's)
    train = re.findall(r"Train Epoch: \d+ \[\d+/\d+ \(\d+%\)\]\tLoss: \d+\.\d{6}", proc.stdout)
    assert len(train) == 2 * (len(want) - len(test_lines)), (train, want)
    for line in want:
        if line.startswith("Train Epoch"):
            assert any(_same(line, other) for other in train), (line, train)
    # --hosts: horovod.run put ranks on those hosts; the native launch stops and says what to do
    proc = subprocess.run([sys.executable, str(native), "--num-proc", "2", "--hosts", "a:1,b:1"] + argv,
                          cwd=tmp_path, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "hosts: run this script under torchrun on each host" in proc.stderr, proc.stderr
    assert "Train Epoch" not in proc.stdout


def _same(got: str, want: str) -> bool:
    try:
        assert_same_metrics([got], [want])
    except AssertionError:
        return False
    return True


BENCHMARK_ARGS = ["--model", "squeezenet1_1", "--batch-size", "2", "--num-warmup-batches", "1",
                  "--num-batches-per-iter", "1", "--num-iters", "2"]


def _benchmark_report(lines):
    """The benchmark's log with its throughput figures masked (they are timings)."""
    import re

    return [re.sub(r"\d+\.\d+", "#", line) for line in lines if line.strip()]


@pytest.mark.skipif(CI, reason=(
    "the long round's: CI runs the elastic synthetic benchmark's rewrite against the unchanged "
    "script (below), which has this script's rewrites; this one comes out native in CI "
    "(test_upstream_script_becomes_native)"))
def test_pytorch_synthetic_benchmark_rewritten_reports_like_the_unchanged_script(tmp_path):
    """Throughput is a timing, so the log is compared with its figures masked. With
    --fp16-allreduce the rewritten script registers DDP's fp16 hook at run time (the plain
    averaging path is what the MNIST test runs)."""
    extra = ["--fp16-allreduce"]
    native = tmp_path / "pytorch_synthetic_benchmark_native.py"
    native.write_text(_rewrite("examples/pytorch/pytorch_synthetic_benchmark.py").source)
    got = _benchmark_report(run_ranks(native, BENCHMARK_ARGS + extra))
    want = _benchmark_report(run_ranks(UPSTREAM / "examples/pytorch/pytorch_synthetic_benchmark.py",
                                       BENCHMARK_ARGS + extra))
    assert "Number of CPUs: 2" in want and sum(line.startswith("Iter #") for line in want) == 2
    assert got == want


ELASTIC_MNIST = "examples/elastic/pytorch/pytorch_mnist_elastic.py"


@pytest.fixture(scope="module")
def elastic_mnist_native(tmp_path_factory):
    """One run of the rewritten elastic MNIST script (1 epoch, the checkpoint it commits to), which
    two tests read: the trains-like test compares its metrics with the unchanged script's, the
    resume test starts the same job again from the checkpoint it left.  (They ran the very same
    launch each, same script, arguments, data and environment.)  Returns (folder, the rewritten
    script, the data folder, rank 0's stdout lines)."""
    folder = tmp_path_factory.mktemp("elastic_mnist")
    data = write_mnist(folder / "data")
    native = folder / "pytorch_mnist_elastic_native.py"
    native.write_text(_rewrite(ELASTIC_MNIST).source)
    env = {"HOME": str(folder), "ELASTIC_CHECKPOINT": str(folder / "state.pt")}
    lines = run_ranks(native, MNIST_ARGS + ["--data-dir", str(data)], env)
    return folder, native, data, lines


def test_pytorch_mnist_elastic_rewritten_trains_like_the_unchanged_script_on_the_shim(tmp_path, elastic_mnist_native):
    """Without failures an elastic run is a plain run: same metrics, and the native state was
    checkpointed by rank 0 at its commits."""
    folder, _, data, lines = elastic_mnist_native
    prefixes = ("Train Epoch", "Test set")
    got = metrics(lines, prefixes)
    assert (folder / "state.pt").is_file()
    argv = MNIST_ARGS + ["--data-dir", str(data)]
    env = {"HOME": str(tmp_path), "ELASTIC_CHECKPOINT": str(tmp_path / "state.pt")}
    want = metrics(run_ranks(UPSTREAM / ELASTIC_MNIST, argv, env), prefixes)
    assert any(line.startswith("Test set") for line in want)
    assert_same_metrics(got, want)


def test_pytorch_synthetic_benchmark_elastic_rewritten_reports_like_the_unchanged_script(tmp_path):
    script = "examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py"
    native = tmp_path / "pytorch_synthetic_benchmark_elastic_native.py"
    native.write_text(_rewrite(script).source)
    argv = BENCHMARK_ARGS + ["--num-batches-per-commit", "1"]
    env = {"ELASTIC_CHECKPOINT": str(tmp_path / "state.pt")}
    got = _benchmark_report(run_ranks(native, argv, env))
    want = _benchmark_report(run_ranks(UPSTREAM / script, argv, env))
    assert "Number of CPUs: 2" in want and sum(line.startswith("Iter #") for line in want) == 2
    assert got == want


def test_pytorch_mnist_elastic_rewritten_resumes_from_its_last_commit(tmp_path, elastic_mnist_native):
    """torchrun recovers by restarting every worker, so the rewritten state must resume from rank
    0's last commit when the script starts again.  A second start of the same job (--epochs 2,
    the same checkpoint) resumes where the first stopped: epoch 1's last committed batch was the
    last one, so only that batch runs again (Horovod's script re-runs the batch after its last
    commit), then epoch 2 runs in full; started over, epoch 1 would run in full again.  The first
    start is the shared 1-epoch run (`elastic_mnist_native`); the second starts from a copy of its
    checkpoint, so the shared one is left as that run wrote it."""
    folder, native, data, lines = elastic_mnist_native
    shutil.copyfile(folder / "state.pt", tmp_path / "state.pt")
    env = {"HOME": str(tmp_path), "ELASTIC_CHECKPOINT": str(tmp_path / "state.pt")}
    argv = MNIST_ARGS[2:] + ["--data-dir", str(data)]
    assert MNIST_ARGS[:2] == ["--epochs", "1"]  # the shared run was the first start, --epochs 1
    first = metrics(lines, ("Train Epoch",))
    batches = len(first)
    assert batches == 3 and all(line.startswith("Train Epoch: 1 ") for line in first)
    second = metrics(run_ranks(native, ["--epochs", "2"] + argv, env), ("Train Epoch",))
    assert [line.split(" [")[0] for line in second] == ["Train Epoch: 1"] + ["Train Epoch: 2"] * batches, second


def test_check_json_over_the_upstream_examples_lists_only_the_allowed_todos():
    """What a CI job would run: every upstream script would change, and the only TODOs left are
    the Lightning-1 hooks."""
    import io
    import json

    from horovod_compat.migrate.cli import main

    out = io.StringIO()
    status = main(["--check", "--format", "json", str(UPSTREAM / "examples/pytorch"),
                   str(UPSTREAM / "examples/elastic/pytorch")], stdout=out, stderr=io.StringIO())
    report = json.loads(out.getvalue())
    assert status == 1 and report["summary"]["files"] == len(SCRIPTS) == report["summary"]["would_change"]
    for entry in report["files"]:
        script = str(Path(entry["path"]).relative_to(UPSTREAM))
        assert {t["name"] for t in entry["todos"]} == ALLOWED_TODOS.get(script, set()), entry["todos"]


IMAGENET_SCRIPTS = ("examples/pytorch/pytorch_imagenet_resnet50.py",
                    "examples/elastic/pytorch/pytorch_imagenet_resnet50_elastic.py")


@pytest.mark.skipif(CI, reason=(
    "the long round's (ResNet-50: about 45 s of a busy 2-core machine): both scripts come out native "
    "in CI (test_upstream_script_becomes_native), and CI runs their rewrites against the originals "
    "in smaller programs: no_sync() for --batches-per-allreduce (the corpus's a06_grad_accum.py), "
    "the elastic state and commits (the elastic MNIST below)"))
@pytest.mark.parametrize("script", IMAGENET_SCRIPTS, ids=["plain", "elastic"])
def test_pytorch_imagenet_resnet50_rewritten_trains_like_the_unchanged_script_on_the_shim(tmp_path, script):
    """ResNet-50 on a tiny synthetic ImageFolder, 1 epoch, 2 sub-batches per step
    (--batches-per-allreduce 2: the no_sync() rewrite; the elastic script also commits every batch):
    the checkpoint rank 0 saves after the epoch holds the same weights and momentum buffers as the
    unchanged script's on the shim (the scripts print their metrics only to a progress bar; the
    weights are the stronger check).

    --wd 0: Horovod's broadcast_optimizer_state takes one step on zero gradients to create the
    optimizer's state, and with weight decay that step moves the weights (by lr * wd * w). The shim
    (horovod_compat/torch/functions.py, _materialize_state) and the rewrite
    (_native_broadcast_optimizer_state) both put the weights back, so they agree either way; the
    run keeps --wd 0 so that the comparison does not rest on that step, which ResNet-50 with one
    image per rank and step amplifies into visibly different weights within a few steps
    (migration_guide/differences.md).
    """
    import torch

    pytest.importorskip("tensorboard", reason="Horovod's ImageNet examples import torch.utils.tensorboard, "
                        "which needs the tensorboard package")
    from upstream import write_image_folder

    images = write_image_folder(tmp_path / "images", classes=2, per_class=2, size=64)  # one step per rank
    native = tmp_path / "imagenet_native.py"
    native.write_text(_rewrite(script).source)
    extra = ["--batches-per-commit", "1"] if "elastic" in script else []
    saved = {}
    for name, path in (("native", native), ("shim", UPSTREAM / script)):
        out = tmp_path / name
        out.mkdir()
        argv = ["--train-dir", str(images), "--val-dir", str(images), "--epochs", "1", "--batch-size", "1",
                "--batches-per-allreduce", "2", "--val-batch-size", "2", "--warmup-epochs", "1", "--wd", "0",
                "--log-dir", str(out / "logs"), "--checkpoint-format", str(out / "checkpoint-{epoch}.pth.tar")]
        run_ranks(path, argv + extra, {"ELASTIC_CHECKPOINT": str(out / "state.pt")}, timeout=900)
        saved[name] = torch.load(out / "checkpoint-1.pth.tar", weights_only=False)
    native_model, shim_model = saved["native"]["model"], saved["shim"]["model"]
    assert native_model.keys() == shim_model.keys()
    for key in native_model:
        assert torch.allclose(native_model[key].float(), shim_model[key].float(), rtol=1e-4, atol=1e-6), key
    native_state, shim_state = saved["native"]["optimizer"]["state"], saved["shim"]["optimizer"]["state"]
    assert native_state.keys() == shim_state.keys() and native_state
    for index, state in native_state.items():
        assert torch.allclose(state["momentum_buffer"], shim_state[index]["momentum_buffer"], rtol=1e-4, atol=1e-6)
