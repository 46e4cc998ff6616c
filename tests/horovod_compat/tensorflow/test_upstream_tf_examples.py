"""Horovod's own TensorFlow 2 and Keras examples, unchanged, on 2 ranks.

Each script runs from Horovod 0.28.1's files in ../shared/upstream (or $HOROVOD_UPSTREAM_DIR)
under `horovodrun -np 2` -- and through its own ``horovod.run`` path where it has one (the
tensorflow2 MNIST scripts given ``<np> <hosts> <comm>``, the elastic one ``<np> <min> <max>
<hosts>``) -- with a hard timeout; it must exit 0 with its loss falling, and nothing of the
job may be left running (every process of a run carries a marker in its environment; none may
be alive afterwards). The tests skip only when the upstream files or TensorFlow are absent (and
keras_mnist_advanced.py's when SciPy is, see below).

Data: there is no internet here. tests/tf_support.py writes a synthetic, learnable MNIST where
Keras 3 and tf-keras look (``mnist.npz``, ``mnist-<rank>.npz``) and lets them load it offline.
The tensorflow2 MNIST examples build their model without an input shape and run a fixed number
of steps (5 000 per rank, or 24 epochs of 250), so they get 8x8 digits
(examples_support.small_mnist), which keeps each step cheap without touching the scripts; the
examples/keras scripts reshape to 28x28 and get 28x28 digits, fewer of them (an epoch of theirs
is the whole data set).

Which Keras each script runs under: both, Keras 3 (TensorFlow's default ``tf.keras``) and tf-keras
(``TF_USE_LEGACY_KERAS=1``, how Keras 2 code runs on TensorFlow 2.16+), unless it uses
Keras-2-only API on an object Horovod does not wrap -- then tf-keras only, with the reason at
``LEGACY`` below (docs/tensorflow.md has the table).

The examples/keras scripts (keras_mnist.py, keras_mnist_advanced.py) are TensorFlow 1 programs
(``tf.ConfigProto()``, ``tf.Session``, ``K.set_session``, standalone ``keras`` 2: ImageDataGenerator,
``fit_generator``): on TensorFlow 2 keras_mnist.py stops at ``tf.ConfigProto`` right after
``hvd.init()`` and keras_mnist_advanced.py at its import of ImageDataGenerator -- as they would
under a real Horovod; test_keras_examples_stop_at_tensorflow1_api_on_stock_tensorflow2 checks
exactly that. They then run in the environment they were written for, emulated on TensorFlow 2
(examples_support.TF1_KERAS2_SITECUSTOMIZE: those TF1 names from ``tf.compat.v1``, ``keras`` =
tf-keras), where horovod.keras must train them. keras_mnist_advanced.py's ImageDataGenerator
transforms need SciPy (in the project's test extra); where it is missing that test skips, saying
so.

The elastic examples run under elastic horovodrun (``--min-np 1 --max-np 2 -H localhost:2``, as
test_upstream_elastic.py runs the PyTorch ones, whose worker finder this reuses) with one worker
SIGKILLed from outside once training has logged: the job must recover and finish.

The whole module takes about 6 minutes on 2 idle cores (15 on busy ones). CI (CI=true; or
HOROVOD_COMPAT_EXAMPLES_SHORT=1, and =0 for the full version anywhere) runs a short version,
four launches (about 3 minutes of a busy 2-core machine):
- tensorflow2_synthetic_benchmark.py (a DistributedGradientTape in a tf.function,
  broadcast_variables after the first step: tensorflow2_mnist.py's training step), under tf-keras;
- tensorflow2_keras_mnist.py under tf-keras, stopped (SIGTERM to the job, nothing left running)
  once it has shown what the test checks: the loss fallen, the warmup's learning rate;
- the elastic examples: tensorflow2_mnist_elastic.py through horovod.run (Keras 3),
  tensorflow2_keras_mnist_elastic.py with a worker killed (tf-keras), stopped after the recovery
  and two epochs;
- the full version adds tensorflow2_mnist.py (5 000 steps: the training step above, the
  elastic MNIST's rank-0 checkpoint), tensorflow2_mnist_elastic.py with a worker killed
  (tf-keras), tensorflow2_keras_synthetic_benchmark.py (Keras 3's fit with
  DistributedOptimizer: test_keras_binding.py and Horovod's test_tensorflow2_keras.py run it in
  CI), the examples/keras scripts in their TF1 + Keras 2 environment and on stock TensorFlow 2
  (horovod.keras: test_keras_binding.py in CI), every script under
  both Keras, the second launches through horovod.run, and full lengths (exit status, last
  step or epoch, every checkpoint).
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Dict

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from examples_support import (  # noqa: E402
    CI, EXAMPLES, UPSTREAM, epoch_losses, epoch_progress, keras_mnist_env, rank_lines, run,
    small_mnist, step_losses, synthetic_mnist, tf1_keras2_env,
)
from procs import left_after  # noqa: E402 - tests/, on sys.path through examples_support

TF2 = EXAMPLES / "tensorflow2"
KERAS = EXAMPLES / "keras"
ELASTIC = EXAMPLES / "elastic" / "tensorflow2"
HOROVODRUN = [sys.executable, "-m", "horovod_compat.run", "-np", "2"]
ELASTIC_HOROVODRUN = [sys.executable, "-m", "horovod_compat.run", "-np", "2", "--min-np", "1",
                      "--max-np", "2", "-H", "localhost:2"]

# Keras 3 unless the script needs Keras 2:
KERAS3 = {"TF_USE_LEGACY_KERAS": "0"}
# tensorflow2_mnist.py and tensorflow2_synthetic_benchmark.py broadcast ``opt.variables()`` of a
# plain ``tf.optimizers.*`` optimizer (not Horovod's); Keras 3 optimizers have ``variables`` as a
# property (a list: "'list' object is not callable"). tensorflow2_mnist_elastic.py resets the
# learning rate with ``opt.lr.assign(...)`` on a plain optimizer; Keras 3 optimizers have no
# ``lr``. Horovod's own DistributedOptimizer on Keras 3 accepts both spellings; these objects are
# the user's.
LEGACY = {"TF_USE_LEGACY_KERAS": "1"}
#: Every other script runs under both. Under tf-keras a Sequential with no input shape (the MNIST
#: scripts') has no weights until its first batch; Keras 3 builds it before training.
#: The short version runs each such script under one of them (`both_keras(short=...)`), Keras 3
#: for some and tf-keras for others, so that both run a plain and an elastic script.

pytestmark = [
    pytest.mark.skipif(not TF2.is_dir(), reason=f"Horovod's upstream files are not at {UPSTREAM} "
                       "(set HOROVOD_UPSTREAM_DIR to a Horovod 0.28.1 checkout)"),
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not installed (pip install 'horovod-compat[tensorflow]')"),
]

#: The short version (see the module docstring): CI's, unless HOROVOD_COMPAT_EXAMPLES_SHORT says.
SHORT = os.environ.get("HOROVOD_COMPAT_EXAMPLES_SHORT", "1" if CI else "0") == "1"

full_only = pytest.mark.skipif(SHORT, reason=(
    "slow, not broken: runs in the full version only (CI runs the short one; "
    "HOROVOD_COMPAT_EXAMPLES_SHORT=0 runs it anywhere), see the module docstring"))


def both_keras(short: str):
    """Parametrize `keras` with Keras 3 and tf-keras; the short version runs only `short`'s."""
    return pytest.mark.parametrize("keras", [
        pytest.param(env, id=name, marks=() if name == short else pytest.mark.skipif(SHORT, reason=(
            f"the short version runs this script under {short} only; the full version under both "
            "(HOROVOD_COMPAT_EXAMPLES_SHORT=0), see the module docstring")))
        for name, env in (("keras3", KERAS3), ("tf_keras", LEGACY))])


# ----------------------------------------------------------------------------- helpers

def _marker_env() -> Dict[str, str]:
    return {"HOROVOD_COMPAT_TEST_MARKER": f"examples-{uuid.uuid4().hex}"}


def _assert_nothing_left(marker: Dict[str, str]) -> None:
    (key, value), = marker.items()
    assert left_after(f"{key}={value}") == [], "a launcher or rank of the example outlived it"


def _launch(argv, tmp_path: Path, env: Dict[str, str], timeout: float, stop_when: str = None,
            **kill):
    """Run an example with a hard timeout; it must exit 0 -- or, with `stop_when`, have shown
    that line (and no error before it) when the test stopped it. Nothing may be left."""
    marker = _marker_env()
    done = run(argv, env={**env, **marker}, cwd=tmp_path, timeout=timeout, stop_when=stop_when,
               **kill)
    _assert_nothing_left(marker)
    assert not done.timed_out, f"the example did not finish in {timeout}s:\n" + done.tail()
    if stop_when is None:
        assert done.returncode == 0, f"the example failed ({done.returncode}):\n" + done.tail()
    else:
        assert done.stopped_at is not None, \
            f"no line matched {stop_when!r} ({done.returncode}):\n" + done.tail()
        # no error before the stop; an elastic job's recovery logs the error it recovers from
        # (its traceback -- chained ones count once -- then "...; restoring the last commit")
        out = done.before_stop
        errors = (out.count("Traceback (most recent call last)")
                  - out.count("The above exception was the direct cause of the following exception")
                  - out.count("During handling of the above exception, another exception occurred"))
        assert errors <= out.count("restoring the last commit"), out[-5000:]
    return done


def _assert_falls(losses, what: str, factor: float = 4.0, start: float = None) -> None:
    """The loss at the start (`start`: the first step's, default the first value of `losses`)
    is an untrained model's, and the mean of the last three of `losses` is `factor` times lower."""
    values = [v for _, v in losses]
    assert len(values) >= 3, f"{what}: too few losses: {losses}"
    start = values[0] if start is None else start
    tail = sum(values[-3:]) / 3
    assert start > 1.0, f"{what}: the first loss is that of a trained model: {start}, {losses[:5]}"
    assert tail * factor < start, f"{what}: the loss did not fall: {start}, {losses[:5]} ... {losses[-5:]}"


def _assert_fit_falls(lines, what: str, epochs: int, factor: float) -> None:
    """Keras' progress bar: the first step's loss is an untrained model's (about ln 10 = 2.3),
    the last epochs' mean losses `factor` times lower."""
    progress = epoch_progress(lines)
    assert len(progress) >= epochs, f"{what}: {progress}"
    _assert_falls([(e, last) for e, _, last in progress], what, factor, start=progress[0][1])


@pytest.fixture()
def small_env(tmp_path):
    """tf_support's offline MNIST of 8x8 digits (see the module docstring)."""
    return keras_mnist_env(tmp_path / "data", data=small_mnist())


@pytest.fixture()
def mnist28_env(tmp_path):
    """tf_support's offline MNIST of 28x28 digits, 1024 train and 256 test images."""
    return keras_mnist_env(tmp_path / "data", data=synthetic_mnist(train=1024, test=256))


# ----------------------------------------------------------------------------- tensorflow2_mnist.py

def _check_tensorflow2_mnist(out: str, tmp_path: Path, steps: int = 5000) -> None:
    losses = step_losses(rank_lines(out, 0))
    # 10000 // hvd.size() steps per rank, rank 0 logs every 10th
    assert [s for s, _ in losses][:steps // 10] == list(range(0, steps, 10)), out[-3000:]
    assert not step_losses(rank_lines(out, 1)), "only rank 0 logs"
    _assert_falls(losses, "tensorflow2_mnist.py", factor=20)
    if steps == 5000:
        assert len(losses) == 500, out[-3000:]
        assert (tmp_path / "checkpoints-1.index").is_file(), sorted(os.listdir(tmp_path))


@full_only  # the short version runs its training step in tensorflow2_synthetic_benchmark.py and its
#             checkpoint in tensorflow2_mnist_elastic.py (below)
@pytest.mark.timeout(600)
def test_tensorflow2_mnist_under_horovodrun(tmp_path, small_env):
    stop = r"^\[0\]<std(?:out|err)>:Step #300\s" if SHORT else None
    done = _launch([*HOROVODRUN, sys.executable, str(TF2 / "tensorflow2_mnist.py")], tmp_path,
                   {**small_env, **LEGACY}, timeout=540, stop_when=stop)
    _check_tensorflow2_mnist(done.before_stop, tmp_path, steps=310 if SHORT else 5000)


@full_only
@pytest.mark.timeout(600)
def test_tensorflow2_mnist_through_horovod_run(tmp_path, small_env):
    done = _launch([sys.executable, str(TF2 / "tensorflow2_mnist.py"), "2", "localhost:2", "gloo"],
                   tmp_path, {**small_env, **LEGACY}, timeout=540)
    assert "Running training through horovod.run" in done.output
    _check_tensorflow2_mnist(done.output, tmp_path)


# ----------------------------------------------------------------------------- tensorflow2_keras_mnist.py

def _check_tensorflow2_keras_mnist(out: str, tmp_path: Path, epochs: int = 24) -> None:
    losses = epoch_losses(rank_lines(out, 0))
    assert [e for e, _ in losses][:epochs] == list(range(1, epochs + 1)), out[-3000:]
    assert not epoch_losses(rank_lines(out, 1)), "rank 1 trains with verbose=0"
    _assert_fit_falls(rank_lines(out, 0), "tensorflow2_keras_mnist.py", epochs, factor=20)
    # LearningRateWarmupCallback(verbose=1): lr 0.001 * size reached at the end of epoch 3
    assert re.search(r"Epoch 3: finished gradual learning rate warmup to 0\.002", out), out[-3000:]
    saved = {p.name for p in tmp_path.glob("checkpoint-*.h5")}
    assert saved >= {f"checkpoint-{e}.h5" for e in range(1, epochs + 1)}, saved
    if epochs == 24:
        assert len(saved) == 24, saved


@both_keras(short="tf_keras")
@pytest.mark.timeout(600)
def test_tensorflow2_keras_mnist_under_horovodrun(tmp_path, small_env, keras):
    stop = r"^\[0\]<std(?:out|err)>:Epoch 5/24\s*$" if SHORT else None
    done = _launch([*HOROVODRUN, sys.executable, str(TF2 / "tensorflow2_keras_mnist.py")], tmp_path,
                   {**small_env, **keras}, timeout=540, stop_when=stop)
    _check_tensorflow2_keras_mnist(done.before_stop, tmp_path, epochs=4 if SHORT else 24)


@full_only
@both_keras(short="tf_keras")
@pytest.mark.timeout(600)
def test_tensorflow2_keras_mnist_through_horovod_run(tmp_path, small_env, keras):
    done = _launch([sys.executable, str(TF2 / "tensorflow2_keras_mnist.py"), "2", "localhost:2",
                    "gloo"], tmp_path, {**small_env, **keras}, timeout=540)
    assert "Running training through horovod.run" in done.output
    _check_tensorflow2_keras_mnist(done.output, tmp_path)


# ----------------------------------------------------------------------------- synthetic benchmarks

# MobileNetV3Small (2.5 M parameters) from tf.keras.applications, built with weights=None by the
# scripts (nothing is downloaded), on 224x224 random images: the smallest application model.
BENCHMARK_ARGS = ["--model", "MobileNetV3Small", "--batch-size", "4", "--num-batches-per-iter",
                  "2", "--num-iters", "3", "--no-cuda"]


def _check_benchmark(out: str) -> None:
    lines = rank_lines(out, 0)
    assert "Model: MobileNetV3Small" in lines and "Number of CPUs: 2" in lines, out[-3000:]
    iters = [line for line in lines if re.fullmatch(r"Iter #\d+: [\d.]+ img/sec per CPU", line)]
    assert len(iters) == 3, out[-3000:]
    assert any(re.fullmatch(r"Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+", line)
               for line in lines), out[-3000:]
    assert not any(line.startswith("Iter #") for line in rank_lines(out, 1)), "only rank 0 logs"


@pytest.mark.timeout(300)
def test_tensorflow2_synthetic_benchmark(tmp_path):
    done = _launch([*HOROVODRUN, sys.executable, str(TF2 / "tensorflow2_synthetic_benchmark.py"),
                    *BENCHMARK_ARGS, "--num-warmup-batches", "2"], tmp_path,
                   {"HOME": str(tmp_path), **LEGACY}, timeout=240)
    _check_benchmark(done.output)
    assert "Running warmup..." in rank_lines(done.output, 0)


@full_only  # (Keras 3's fit with DistributedOptimizer runs in CI in test_keras_binding.py and
#             Horovod's test_tensorflow2_keras.py; the TF2 synthetic benchmark above in CI)
@both_keras(short="keras3")
@pytest.mark.timeout(300)
def test_tensorflow2_keras_synthetic_benchmark(tmp_path, keras):
    done = _launch([*HOROVODRUN, sys.executable,
                    str(TF2 / "tensorflow2_keras_synthetic_benchmark.py"), *BENCHMARK_ARGS],
                   tmp_path, {"HOME": str(tmp_path), **keras}, timeout=240)
    _check_benchmark(done.output)


@full_only
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["tensorflow2_mnist.py", "tensorflow2_synthetic_benchmark.py"])
def test_keras2_scripts_stop_under_keras3_at_their_own_optimizer(script, tmp_path, small_env):
    """Why these two run under tf-keras only (LEGACY): under Keras 3 both stop at their first step,
    in ``opt.variables()`` of their own plain Keras optimizer (a list on Keras 3), not in Horovod."""
    args = BENCHMARK_ARGS if script == "tensorflow2_synthetic_benchmark.py" else []
    marker = _marker_env()
    done = run([*HOROVODRUN, sys.executable, str(TF2 / script), *args],
               env={**small_env, "HOME": str(tmp_path), **KERAS3, **marker}, cwd=tmp_path,
               timeout=240)
    _assert_nothing_left(marker)
    assert not done.timed_out and done.returncode not in (0, None), done.tail()
    # in a tf.function: TensorFlow's "in user code:" report names the script's line, then the error
    assert re.search(r"File \"[^\"]*" + re.escape(script) + r"\", line \d+, in \w+[^\n]*\n\s*"
                     r"hvd\.broadcast_variables\(opt\.variables\(\), root_rank=0\)\n\s*"
                     r"TypeError: 'list' object is not callable", done.output), done.tail()


# ----------------------------------------------------------------------------- examples/keras

KERAS_EXAMPLES = {"keras_mnist.py": [],
                  # 3 epochs of 1024 // 32 // 2 = 16 steps per rank
                  "keras_mnist_advanced.py": ["--epochs", "3", "--batch-size", "32"]}


# Where each stops on stock TensorFlow 2: (the line of the script, the error). `import keras` is
# Keras 3 whatever TF_USE_LEGACY_KERAS says (it only picks what tf.keras is).
STOCK_TF2_STOPS = {
    "keras_mnist.py": (r"config = tf\.ConfigProto\(\)",
                       r"AttributeError: module 'tensorflow' has no attribute 'ConfigProto'"),
    "keras_mnist_advanced.py": (r"from keras\.preprocessing\.image import ImageDataGenerator",
                                r"ImportError: cannot import name 'ImageDataGenerator' from "
                                r"'keras\.preprocessing\.image'"),
}


@pytest.mark.timeout(300)
@full_only
@pytest.mark.parametrize("script", sorted(KERAS_EXAMPLES))
def test_keras_examples_stop_at_tensorflow1_api_on_stock_tensorflow2(script, tmp_path, mnist28_env):
    """Upstream's examples/keras are TensorFlow 1 + standalone Keras 2 code: on TensorFlow 2, with
    either Keras, keras_mnist.py stops at ``tf.ConfigProto()`` right after ``hvd.init()`` and
    keras_mnist_advanced.py at its import of ImageDataGenerator (gone in Keras 3) -- where they
    stop under a real Horovod too. Not horovod-compat failures; the next tests run them in the
    environment they were written for."""
    line, error = STOCK_TF2_STOPS[script]
    for keras in (LEGACY,) if SHORT else (KERAS3, LEGACY):
        marker = _marker_env()
        done = run([*HOROVODRUN, sys.executable, str(KERAS / script), *KERAS_EXAMPLES[script]],
                   env={**mnist28_env, **keras, **marker}, cwd=tmp_path, timeout=240)
        _assert_nothing_left(marker)
        assert not done.timed_out and done.returncode not in (0, None), done.tail()
        assert re.search(error, done.output), done.tail()
        # the traceback's frame of the script, then its line (both maybe behind a rank prefix)
        assert re.search(r'File "[^"]*' + re.escape(script) + r'", line \d+, in <module>\n'
                         r"[^\n]*?" + line, done.output), done.tail()


@full_only  # (horovod.keras runs in CI in test_keras_binding.py)
@pytest.mark.timeout(300)
def test_keras_mnist_in_its_tensorflow1_keras2_environment(tmp_path, mnist28_env):
    env = tf1_keras2_env(tmp_path / "data", mnist28_env)
    done = _launch([*HOROVODRUN, sys.executable, str(KERAS / "keras_mnist.py")], tmp_path, env,
                   timeout=240)
    out = done.output
    # epochs = ceil(12 / hvd.size()); rank 0 shows the progress bar (verbose=1)
    losses = epoch_losses(rank_lines(out, 0))
    assert [e for e, _ in losses] == list(range(1, 7)), out[-3000:]
    _assert_fit_falls(rank_lines(out, 0), "keras_mnist.py", 6, factor=10)
    for rank in (0, 1):
        lines = rank_lines(out, rank)
        assert "1024 train samples" in lines, out[-3000:]
        accuracy = [float(line.split()[-1]) for line in lines if line.startswith("Test accuracy:")]
        assert accuracy and accuracy[0] > 0.9, out[-3000:]
    # the ranks end with the same weights: the same test loss (evaluate runs on every rank)
    assert ({line for line in rank_lines(out, 0) if line.startswith("Test loss:")}
            == {line for line in rank_lines(out, 1) if line.startswith("Test loss:")}), out[-3000:]
    saved = sorted(p.name for p in tmp_path.glob("checkpoint-*.h5"))
    assert saved == [f"checkpoint-{e}.h5" for e in range(1, 7)], saved


@full_only
@pytest.mark.timeout(300)
def test_keras_mnist_advanced_in_its_tensorflow1_keras2_environment(tmp_path, mnist28_env):
    if importlib.util.find_spec("scipy") is None:
        pytest.skip("keras_mnist_advanced.py's ImageDataGenerator(rotation_range=..., ...) needs "
                    "SciPy, which is not installed here (pip install scipy; horovod-compat's test extra has it)")
    env = tf1_keras2_env(tmp_path / "data", mnist28_env)
    done = _launch([*HOROVODRUN, sys.executable, str(KERAS / "keras_mnist_advanced.py"),
                    *KERAS_EXAMPLES["keras_mnist_advanced.py"]], tmp_path, env, timeout=240)
    out = done.output
    for rank in (0, 1):  # verbose=1 on every rank here
        losses = epoch_losses(rank_lines(out, rank))
        assert [e for e, _ in losses] == [1, 2, 3], out[-3000:]
        # MetricAverageCallback: the ranks log the same averaged loss
        assert losses == epoch_losses(rank_lines(out, 0)), out[-3000:]
        assert losses[-1][1] * 1.5 < losses[0][1], f"the loss did not fall: {losses}"
    # LearningRateWarmupCallback: lr = initial_lr * (epoch * (size - 1) / warmup_epochs + 1) / size
    # after each epoch's last batch, with initial_lr = 1.0 * size = 2 and 5 warmup epochs
    lrs = [float(x) for x in re.findall(r" - lr: ([\d.]+)", "\n".join(rank_lines(out, 0)))]
    assert lrs == pytest.approx([1.2, 1.4, 1.6]), lrs
    assert (tmp_path / "checkpoint-3.h5").is_file()


# ----------------------------------------------------------------------------- elastic

def _worker_pids():
    from test_upstream_elastic import worker_pids  # the PyTorch elastic test's finder

    return worker_pids


def _check_recovered(done) -> None:
    assert done.killed is not None, \
        "the trigger line never came with two workers running:\n" + done.tail()
    out = done.before_stop
    assert re.search(r"elastic job: worker \d+ \(rank \d+ of round \d+, host \S+\) killed by "
                     r"SIGKILL", out), done.tail()
    assert "restoring the last commit" in out, done.tail()


@full_only  # (CI: its rewrite-free script through horovod.run below; a killed worker's recovery
#             through the same TensorFlowKerasState, KerasState's base, in the keras elastic kill
#             below and in test_elastic_keras_unbuilt.py)
@pytest.mark.timeout(480)
def test_tensorflow2_mnist_elastic_survives_a_killed_worker(tmp_path, mnist28_env):
    # 28x28 digits: the script runs 100 // size steps, and the kill must land mid-training
    done = _launch([*ELASTIC_HOROVODRUN, sys.executable, str(ELASTIC / "tensorflow2_mnist_elastic.py")],
                   tmp_path, {**mnist28_env, **LEGACY}, timeout=420,
                   kill_worker_when=r"\[0\]<std(?:out|err)>:Step #10\b", worker_pids=_worker_pids())
    _check_recovered(done)
    losses = step_losses(rank_lines(done.output, 0))
    assert losses and losses[-1][0] > 10, done.tail()  # it trained on after the kill
    assert losses[0][1] > 1.0 and losses[-1][1] < losses[0][1] / 2, losses
    assert (tmp_path / "checkpoints-1.index").is_file(), sorted(os.listdir(tmp_path))


@full_only
@pytest.mark.timeout(480)
def test_tensorflow2_mnist_elastic_stops_under_keras3_at_its_first_reset(tmp_path, mnist28_env):
    """Why the kill runs under tf-keras only: under Keras 3 the script's reset callback stops at
    ``opt.lr`` of its own plain optimizer (Keras 3 optimizers have no ``lr``); without a reset it
    runs under Keras 3 (test_tensorflow2_mnist_elastic_through_horovod_run[keras3])."""
    marker = _marker_env()
    done = run([*ELASTIC_HOROVODRUN, sys.executable, str(ELASTIC / "tensorflow2_mnist_elastic.py")],
               env={**mnist28_env, **KERAS3, **marker}, cwd=tmp_path, timeout=420,
               kill_worker_when=r"\[0\]<std(?:out|err)>:Step #10\b", worker_pids=_worker_pids())
    _assert_nothing_left(marker)
    _check_recovered(done)
    assert re.search(r"in on_state_reset\n[^\n]*opt\.lr\.assign\(lr \* hvd\.size\(\)\)\n(?:[^\n]*\^+\n)?"
                     r"[^\n]*AttributeError: 'Adam' object has no attribute 'lr'", done.output), \
        done.tail()


@both_keras(short="keras3")
@pytest.mark.timeout(480)
def test_tensorflow2_mnist_elastic_through_horovod_run(tmp_path, small_env, keras):
    """``python tensorflow2_mnist_elastic.py 2 1 2 localhost:2``: horovod.run(main, num_proc=2,
    min_num_proc=1, max_num_proc=2, ...) runs the function as an elastic job (no failure here, so
    8x8 digits: no kill has to land mid-training)."""
    done = _launch([sys.executable, str(ELASTIC / "tensorflow2_mnist_elastic.py"), "2", "1", "2",
                    "localhost:2"], tmp_path, {**small_env, **keras}, timeout=420)
    assert "Running training through horovod.run" in done.output
    losses = step_losses(done.output.split("\n"))
    assert [s for s, _ in losses] == [0, 10, 20, 30, 40], done.tail()  # 100 // 2 steps, rank 0
    assert losses[-1][1] < losses[0][1] / 2, losses
    assert (tmp_path / "checkpoints-1.index").is_file(), sorted(os.listdir(tmp_path))


@both_keras(short="tf_keras")
@pytest.mark.timeout(600)
def test_tensorflow2_keras_mnist_elastic_survives_a_killed_worker(tmp_path, small_env, keras):
    # short: stopped once the restarted fit has done 2 epochs
    stop = r"^\[0\]<std(?:out|err)>:Epoch 3/2[0-2]\s*$" if SHORT else None
    done = _launch([*ELASTIC_HOROVODRUN, sys.executable,
                    str(ELASTIC / "tensorflow2_keras_mnist_elastic.py")],
                   tmp_path, {**small_env, **keras}, timeout=540, stop_when=stop,
                   kill_worker_when=r"\[0\]<std(?:out|err)>:Epoch 3/24", worker_pids=_worker_pids())
    _check_recovered(done)
    lines = rank_lines(done.before_stop, 0)
    # epochs 1-2 before the kill, then fit(epochs=24 - state.epoch) again from the last commit:
    # its epochs count from 1 again, up to 24 minus the epochs done before. The fit restarts
    # once per reset: when the survivor goes on alone, and again when the replacement joins
    headers = [tuple(map(int, m)) for m in
               re.findall(r"^Epoch (\d+)/(\d+)\s*$", "\n".join(lines), re.M)]
    assert headers[:2] == [(1, 24), (2, 24)], headers
    last, total = headers[-1]
    assert 20 <= total <= 22, headers
    restart = len(headers) - 1 - headers[::-1].index((1, total))  # the last restart
    if SHORT:
        assert headers[restart:] == [(1, total), (2, total), (3, total)], headers
        _assert_fit_falls(lines, "tensorflow2_keras_mnist_elastic.py", 4, factor=20)
        assert (tmp_path / "checkpoint-2.h5").is_file(), sorted(os.listdir(tmp_path))
    else:
        assert last == total and len(headers) - restart == total, headers
        _assert_fit_falls(lines, "tensorflow2_keras_mnist_elastic.py", 24, factor=20)
        assert (tmp_path / f"checkpoint-{total}.h5").is_file(), sorted(os.listdir(tmp_path))
