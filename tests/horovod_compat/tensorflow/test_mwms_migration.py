"""The TF/Keras road out (migration_guide/tensorflow.md): the same deterministic Keras training as a
Horovod script (``mwms_train_horovod.py``: ``hvd.DistributedOptimizer``, each rank half of the
global batch) and on ``tf.distribute.MultiWorkerMirroredStrategy`` (``mwms_train_native.py``: the
strategy splits the global batch), 2 ranks each, ends with the same weights as one process on the
full batch.

Four launches at once (about 60 s on 2 busy cores): Horovod under horovodrun; MWMS under horovodrun with
``TF_CONFIG`` agreed over ``hvd.init()`` (``agree_tf_config``); MWMS on tf-keras
(``TF_USE_LEGACY_KERAS=1``) with ``TF_CONFIG`` from the launcher's rank and fixed ports
(``tf_config_for``); one process.  Plus ``tf_config_for`` / ``rank_and_size`` without launches.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "torch"))
from hvd_launch import _launch, horovodrun  # noqa: E402

#: A bound for a hang, not a speed check: the four launches together (7 TensorFlow processes)
#: take about 60 s on 2 busy cores, and several times that beside another suite worker and busy
#: loops.
LAUNCH_TIMEOUT = 480

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="tensorflow is not installed (pip install "
                                        "'horovod-compat[tensorflow]')"),
              # the first test that takes `runs` includes the launches
              pytest.mark.timeout(LAUNCH_TIMEOUT + 120)]

#: Identical math in a different order (a sum of two halves vs one sum): float32 round-off only.
ATOL = 1e-5
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
#: global batch 32 = 2 x 16, 160 samples: 5 steps per epoch, 2 epochs = 10 SGD (momentum) steps
ARGS = ["--batch-per-worker", "16", "--base-lr", "0.05", "--epochs", "2", "--samples", "160"]
#: one process: the global batch, and the learning rate the 2-worker scripts scale to (0.05 x 2)
SINGLE_ARGS = ["--batch-per-worker", "32", "--base-lr", "0.1", "--epochs", "2", "--samples", "160"]


def _two_free_ports() -> int:
    """A port p such that p and p + 1 are free now (fixed ports of 2 workers on one host), chosen
    as ``rank_env.free_port`` chooses: below the ephemeral range, where the outgoing connections of
    a busy machine (the other suite worker's) cannot take them before the workers bind them."""
    from distributor.rank_env import free_port

    for _ in range(50):
        p = free_port("")
        if p >= 65535:
            continue
        with socket.socket() as b:
            try:
                b.bind(("", p + 1))
            except OSError:
                continue
            return p
    raise RuntimeError("no two consecutive free ports")


def _weights(path: Path) -> List:
    import numpy as np

    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def _max_diff(a: List, b: List) -> float:
    import numpy as np

    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Dict[str, Dict]:
    """The four launches, at the same time (each is mostly start-up and waiting on its peer)."""
    root = tmp_path_factory.mktemp("mwms")
    jobs = {
        "horovod": ("mwms_train_horovod.py", ARGS, ENV, 2),
        "mwms": ("mwms_train_native.py", ARGS + ["--tf-config", "agree"], ENV, 2),
        "mwms_tf_keras": ("mwms_train_native.py",
                          ARGS + ["--tf-config", "fixed", "--base-port", str(_two_free_ports())],
                          {**ENV, "TF_USE_LEGACY_KERAS": "1"}, 2),
        "single": ("mwms_train_horovod.py", SINGLE_ARGS, ENV, 1),
    }

    def launch(name: str):
        program, extra, env, ranks = jobs[name]
        command = [sys.executable, str(HERE / program), "--out", str(root / name), *extra]
        if ranks == 1:
            return _launch(command, LAUNCH_TIMEOUT, env, None)
        return horovodrun(ranks, command, timeout=LAUNCH_TIMEOUT, env=env)

    saved = os.environ.pop("TF_CONFIG", None)  # a TF_CONFIG of the caller's must not leak in
    try:
        with ThreadPoolExecutor(len(jobs)) as pool:
            launches = dict(zip(jobs, pool.map(launch, jobs)))
    finally:
        if saved is not None:
            os.environ["TF_CONFIG"] = saved
    for name, run in launches.items():
        assert not run.timed_out, f"{name} timed out:\n{run.tail()}"
        assert run.returncode == 0, f"{name} failed:\n{run.tail()}"
    return {name: {"dir": root / name, "launch": run} for name, run in launches.items()}


@pytest.mark.parametrize("name", ["horovod", "mwms", "mwms_tf_keras"])
def test_two_ranks_end_with_the_weights_of_one_process_on_the_global_batch(runs, name):
    single = _weights(runs["single"]["dir"] / "weights.npz")
    got = _weights(runs[name]["dir"] / "weights.npz")
    assert _max_diff(got, single) <= ATOL, f"{name} vs one process: {_max_diff(got, single)}"


@pytest.mark.parametrize("name", ["mwms", "mwms_tf_keras"])
def test_mwms_ends_with_horovods_weights(runs, name):
    hvd = _weights(runs["horovod"]["dir"] / "weights.npz")
    got = _weights(runs[name]["dir"] / "weights.npz")
    assert _max_diff(got, hvd) <= ATOL, f"{name} vs Horovod: {_max_diff(got, hvd)}"


@pytest.mark.parametrize("name", ["horovod", "mwms", "mwms_tf_keras"])
def test_every_rank_holds_the_same_weights(runs, name):
    """The ranks start from different seeds: the broadcast (Horovod) or the strategy (MWMS)
    must make them equal, and the averaged updates keep them equal."""
    first = _weights(runs[name]["dir"] / "weights.rank0.npz")
    second = _weights(runs[name]["dir"] / "weights.rank1.npz")
    assert _max_diff(first, second) == 0.0


@pytest.mark.parametrize("name", ["horovod", "mwms", "mwms_tf_keras"])
def test_epoch_logs_are_the_global_averages(runs, name):
    """Horovod's MetricAverageCallback and the strategy's aggregated metrics both report the
    global batch's loss and MAE, as one process does."""
    single = json.loads((runs["single"]["dir"] / "history.json").read_text())
    got = json.loads((runs[name]["dir"] / "history.json").read_text())
    for key in ("loss", "mae"):
        assert len(got[key]) == 2
        for a, b in zip(got[key], single[key]):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (name, key, got[key], single[key])
    assert single["loss"][1] < single["loss"][0] / 2  # it did learn


@pytest.mark.parametrize("name", ["horovod", "mwms", "mwms_tf_keras"])
def test_only_worker_0_writes_the_checkpoints(runs, name):
    files = sorted(p.name for p in runs[name]["dir"].iterdir())
    assert files == ["ckpt-1.weights.h5", "ckpt-2.weights.h5", "history.json", "weights.npz",
                     "weights.rank0.npz", "weights.rank1.npz"], files


def _tf_configs(launch) -> Dict[int, Dict]:
    configs = {}
    for rank in (0, 1):
        lines = [line for line in launch.rank_lines(rank) if "TF_CONFIG=" in line]
        assert len(lines) == 1, launch.tail()
        configs[rank] = json.loads(lines[0].split("TF_CONFIG=", 1)[1])
    return configs


@pytest.mark.parametrize("name", ["mwms", "mwms_tf_keras"])
def test_each_worker_got_its_tf_config(runs, name):
    configs = _tf_configs(runs[name]["launch"])
    workers = configs[0]["cluster"]["worker"]
    assert configs[1]["cluster"] == {"worker": workers}
    assert [configs[r]["task"] for r in (0, 1)] == [{"type": "worker", "index": 0},
                                                    {"type": "worker", "index": 1}]
    hosts = [w.rsplit(":", 1)[0] for w in workers]
    ports = [int(w.rsplit(":", 1)[1]) for w in workers]
    assert hosts == ["127.0.0.1", "127.0.0.1"] and len(set(ports)) == 2, workers
    if name == "mwms_tf_keras":  # fixed ports: base_port, base_port + 1
        assert ports[1] == ports[0] + 1


# ------------------------------------------------------------------ tf_config_for without launches

def test_tf_config_for_gives_ports_per_host_in_rank_order():
    from horovod_compat.tensorflow.tf_config import tf_config_for

    config = tf_config_for(2, ["a", "a", "b", "b"], base_port=2000)
    assert config == {"cluster": {"worker": ["a:2000", "a:2001", "b:2000", "b:2001"]},
                      "task": {"type": "worker", "index": 2}}
    mixed = tf_config_for(0, ["a:7000", "a", "10.0.0.2:7001"], base_port=2000)
    assert mixed["cluster"]["worker"] == ["a:7000", "a:2000", "10.0.0.2:7001"]
    with pytest.raises(ValueError):
        tf_config_for(3, ["a", "b"])


@pytest.mark.parametrize("environ, expected", [
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "3", "RANK": "9", "WORLD_SIZE": "9"}, (1, 3)),
    ({"RANK": "2", "WORLD_SIZE": "4"}, (2, 4)),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, (0, 2)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2)),
])
def test_rank_and_size_read_every_launchers_variables(environ, expected):
    from horovod_compat.tensorflow.tf_config import rank_and_size, tf_config_for

    assert rank_and_size(environ) == expected
    config = tf_config_for(base_port=3000, environ=environ)  # default: every worker on 127.0.0.1
    assert config["task"]["index"] == expected[0]
    assert config["cluster"]["worker"] == [f"127.0.0.1:{3000 + k}" for k in range(expected[1])]


def test_rank_and_size_without_a_launcher_says_what_is_missing():
    from horovod_compat.tensorflow.tf_config import rank_and_size

    with pytest.raises(RuntimeError, match="HOROVOD_RANK"):
        rank_and_size({})


def _function(source: str, name: str) -> str:
    """``name``'s definition in ``source`` as an AST dump, docstrings left out (comments are not
    in the AST anyway)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            for fn in ast.walk(node):
                body = getattr(fn, "body", None)
                if (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and body
                        and isinstance(body[0], ast.Expr)
                        and isinstance(getattr(body[0], "value", None), ast.Constant)):
                    fn.body = body[1:]
            return ast.dump(node)
    raise AssertionError(f"no function {name}")


def test_the_guides_keras3_fix_is_the_tested_one():
    guide = (HERE.parents[2] / "migration_guide" / "tensorflow.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S)
              if "def fix_keras3_multi_worker_fit" in b]
    assert len(blocks) == 1
    script = (HERE / "mwms_train_native.py").read_text()
    name = "fix_keras3_multi_worker_fit"
    assert _function(blocks[0], name) == _function(script, name)
