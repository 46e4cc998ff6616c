"""Horovod TensorFlow/Keras programs written the way real projects write them (corpus/: 21
programs of our own, one style each -- Keras ``fit`` with Horovod's callbacks, sharded ``tf.data``,
custom loops with ``DistributedGradientTape``, subclassed models, mixed precision, object
collectives and ``join``, elastic states, ``load_model``, embeddings, ``horovod.run``, start-up
boilerplate, ``tf.compat.v1`` sessions, graph-mode Keras, GANs, synchronized batch
normalization, untidy tapes...), each run on 2 CPU ranks with a hard timeout.

Every program checks what Horovod guarantees itself (weights, optimizer state and averaged
metrics identical on every rank) and prints on rank 0 a last line ``RESULT <json>``; this test
wants exit status 0, that line with ``"ranks_agree": true``, finite numbers, and the program's own
figures below (the loss fell, step counts, learning rates...). Nothing of a run may be left
running (every process of a run carries a marker in its environment; none may be alive after).

Markers in a program's docstring: ``Keras: tf-keras`` runs it with ``TF_USE_LEGACY_KERAS=1``
(Keras-2-only code that Keras 3 itself rejects), ``Keras: 3`` with Keras 3; ``Launch: python``
runs it with plain ``python`` (it calls ``horovod.run`` itself), anything else under
``horovodrun -np 2``.

Some programs also train the same model in one process, on rank 0, and check that the distributed
run ended with the same weights (k20, k21: Keras 2 scripts under tf-keras).

Time: a run costs 4-15 s on 2 idle cores (TensorFlow's import and start-up are most of it), the
whole corpus 2-4 minutes (idle or busy cores). Every run of the suite takes the REPRESENTATIVE set
(37-46 s measured); HOROVOD_COMPAT_CORPUS_ALL=1 takes every program.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from examples_support import run  # noqa: E402
from procs import left_after  # noqa: E402 - tests/, on sys.path through examples_support

CORPUS = HERE / "corpus"
PROGRAMS = sorted(p.name for p in CORPUS.glob("*.py"))
HOROVODRUN = [sys.executable, "-m", "horovod_compat.run", "-np", "2"]
TIMEOUT = 240  # seconds per program: over ten times what one takes on 2 busy cores

#: Run in every run of the suite (under a minute on 2 cores): the programs that found bugs in the
#: binding, each the regression test of its fix.
REPRESENTATIVE = [
    "t03_custom_loop_tape.py",       # hvd.allreduce(metric.result()): an eager 0-d tensor
    "k06_mixed_precision.py",        # LossScaleOptimizer around DistributedOptimizer, overflow
    "v13_tf1_monitored_session.py",  # hvd.BroadcastGlobalVariablesHook
    "v18_graph_mode_keras.py",       # Keras in a TF1 graph: callbacks, value collectives,
    #                                  backward_passes_per_step
    "t19_tape_variants.py",          # DistributedGradientTape made inside the tape's with block
    "k20_keras2_resume.py",          # rank 0 alone loads a checkpoint, the others' models unbuilt
    "k21_keras2_train_step.py",      # Keras 2 train_step, every model unbuilt, a deferred restore
]

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not installed (pip install "
                              "'horovod-compat[tensorflow]')"),
]


def _selected() -> List[str]:
    return PROGRAMS if os.environ.get("HOROVOD_COMPAT_CORPUS_ALL") == "1" else REPRESENTATIVE


def _docstring(source: str) -> str:
    return ast.get_docstring(ast.parse(source)) or ""


def _marker(source: str, name: str, default: str) -> str:
    """The value of a ``Name: value`` line of the program's docstring."""
    found = re.search(rf"^{name}: (\S+)", _docstring(source), re.MULTILINE)
    return found.group(1) if found else default


# ----------------------------------------------------------------------------- the figures

def falls(values: List[float]) -> bool:
    return len(values) >= 2 and values[-1] < values[0]


def _close(a: float, b: float, tol: float = 1e-6) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(b))


#: What each program's RESULT must say, beyond ranks_agree and finite numbers.
EXPECT: Dict[str, Callable[[Dict[str, Any]], bool]] = {
    "k01_fit_callbacks.py": lambda r: (
        falls(r["losses"]) and _close(r["lr"], 0.004)  # warmup ended at 0.002 * 2
        and r["checkpoints"] == ["checkpoint-1.keras", "checkpoint-2.keras",
                                 "checkpoint-3.keras"]),
    "k02_tfdata_shard_evaluate.py": lambda r: (
        falls(r["losses"]) and r["val_acc"] > 0.8 and r["iterations"] == r["epochs"] * 32),
    "t03_custom_loop_tape.py": lambda r: (
        falls(r["losses"]) and r["iterations"] == 180 and r["checkpoint"] == "ckpt-3"),
    "t04_tfkeras_resume_h5.py": lambda r: (
        falls(r["losses"]) and r["resumed_at"] == 2 and r["iterations"] == 128
        and _close(r["lr"], 0.02) and r["optimizer"] == "SGD"
        and r["checkpoints"] == [f"checkpoint-{e}.h5" for e in (1, 2, 3, 4)]),
    "k05_subclass_train_step.py": lambda r: falls(r["losses"]) and falls(r["val_losses"]),
    "k06_mixed_precision.py": lambda r: all(
        falls(r[k]["losses"]) and r[k]["loss_scale"] < 32768  # an overflow step was skipped
        for k in ("compile_wraps", "scale_outside", "scale_inside", "custom_loop")),
    "t07_objects_join.py": lambda r: (
        r["steps"] == [20, 26] and r["last_joined"] == 1 and r["total_samples"] == 368
        and r["last_loss"] < r["first_loss"] and r["config_lr"] in (0.05, 0.1)),
    "k08_elastic_keras.py": lambda r: (
        falls(r["losses"]) and r["epoch"] == 4 and r["loop_steps"] == 30),
    "k09_load_model_keras3.py": lambda r: (
        falls(r["losses"]) and r["iterations"] == 2 * r["iterations_saved"] == 64),
    "k10_embedding_sparse.py": lambda r: all(
        falls(r[k]) for k in ("tape_sparse", "tape_dense", "fit_sparse", "fit_dense")),
    "r11_horovod_run_api.py": lambda r: falls(r["losses"]) and r["ranks"] == 2,
    "g12_config_boilerplate.py": lambda r: (
        falls(r["losses"]) and r["count"] == 640 and r["gpus"] == 0),
    "v13_tf1_monitored_session.py": lambda r: (
        r["steps"] == 60 and r["last_loss"] < r["first_loss"]
        and r["mse_after"] < r["mse_before"] and r["checkpoint_written"]),
    "k14_schedule_weights.py": lambda r: (
        falls(r["losses"]) and r["iterations"] == 48 and _close(r["lr"], 0.006 * 0.9 ** 2)),
    "t15_tfkeras_amp_minimize.py": lambda r: (
        falls(r["amp_losses"]) and r["loop_last"] < r["loop_first"] and r["iterations"] == 40),
    "k16_sync_batchnorm.py": lambda r: falls(r["losses"]),
    "k17_gan_two_optimizers.py": lambda r: (
        len(r["d_loss"]) == len(r["g_loss"]) == 3 and r["sample_radius"] > 0),
    "v18_graph_mode_keras.py": lambda r: (
        falls(r["losses"]) and r["resumed_at"] == 0 and _close(r["lr"], 0.04)
        and _close(r["momentum"], 0.9) and len(r["score"]) == 2
        and r["checkpoints"] == [f"v18-checkpoint-{e}.h5" for e in (1, 2, 3)]
        # 2 epochs of 8 batches, each counted (half applied); the weights did move
        and r["passes_iterations"] == 16 and falls(r["passes_losses"])),
    "k20_keras2_resume.py": lambda r: (
        falls(r["losses"]) and len(r["losses"]) == 5 and r["resumed_at"] == 3
        and r["reference_resumed_at"] == 3 and r["reference_gap"] < 1e-5
        and r["checkpoints"] == [f"checkpoint-{e}.h5" for e in (1, 2, 3)]),
    "k21_keras2_train_step.py": lambda r: (
        falls(r["losses"]) and len(r["losses"]) == 5 and r["resumed_at"] == 3
        and r["reference_resumed_at"] == 3 and r["reference_gap"] < 1e-5 and _close(r["lr"], 0.01)
        and r["checkpoints"] == [f"ckpt-{e}.index" for e in (1, 2, 3)]),
    "t19_tape_variants.py": lambda r: all(
        r[k][1] < r[k][0] for k in ("eager", "fn", "multitask", "heads")),
}


def _numbers(value: Any) -> List[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


def _result(output: str, launch: str) -> Dict[str, Any]:
    """Rank 0's RESULT line (horovodrun prefixes it with ``[0]<stdout>:``)."""
    prefix = r"^\[0\]<stdout>:RESULT " if launch == "horovodrun" else r"^RESULT "
    found = re.findall(prefix + r"(\{.*\})\s*$", output, re.MULTILINE)
    assert len(found) == 1, f"expected one RESULT line from rank 0, got {len(found)}"
    return json.loads(found[0])


# ----------------------------------------------------------------------------- the tests

def test_every_program_is_listed_and_marked():
    assert len(PROGRAMS) >= 10 and set(EXPECT) == set(PROGRAMS)
    assert set(REPRESENTATIVE) <= set(PROGRAMS)
    for name in PROGRAMS:
        source = (CORPUS / name).read_text()
        assert _marker(source, "Keras", "") in ("3", "tf-keras"), name
        assert _marker(source, "Launch", "horovodrun") in ("horovodrun", "python"), name
        assert _docstring(source).startswith("Style: "), name


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("name", _selected())
def test_program_runs_on_two_ranks(name, tmp_path):
    source = (CORPUS / name).read_text()
    keras = _marker(source, "Keras", "3")
    launch = _marker(source, "Launch", "horovodrun")
    argv = ([sys.executable, str(CORPUS / name)] if launch == "python"
            else [*HOROVODRUN, sys.executable, str(CORPUS / name)])
    marker = {"HOROVOD_COMPAT_TEST_MARKER": f"corpus-{uuid.uuid4().hex}"}
    env = {"TF_USE_LEGACY_KERAS": "1" if keras == "tf-keras" else "0",
           "CORPUS_WORKDIR": str(tmp_path), **marker}
    done = run(argv, env=env, cwd=tmp_path, timeout=TIMEOUT)
    (key, value), = marker.items()
    assert left_after(f"{key}={value}") == [], "a launcher or rank of the program outlived it"
    assert not done.timed_out, f"{name} did not finish in {TIMEOUT}s:\n" + done.tail()
    assert done.returncode == 0, f"{name} failed ({done.returncode}):\n" + done.tail()
    result = _result(done.output, launch)
    assert result.get("ranks_agree") is True, result
    assert all(math.isfinite(x) for x in _numbers(result)), result
    assert EXPECT[name](result), f"{name}: unexpected figures: {result}"
