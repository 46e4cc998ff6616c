"""A Databricks-style notebook that trains a Keras model with horovod.tensorflow.keras through
HorovodRunner, run under a real Jupyter kernel (nbclient), as test_notebook.py runs the PyTorch one.

The notebook (built here with nbformat) has a cell that defines ``train()`` -- ``import tensorflow
as tf; import horovod.tensorflow.keras as hvd; hvd.init()``, a small model on synthetic in-memory
data, ``model.fit`` with ``hvd.DistributedOptimizer`` and ``BroadcastGlobalVariablesCallback`` --
and cells that run it with ``HorovodRunner(np=-2)`` (2 ranks on the driver) and
``HorovodRunner(np=2)`` (2 ranks as a Spark barrier stage on a local[2] SparkSession; on
Databricks the notebook is given ``spark``, here a first cell starts it the way the other Spark
tests do, and a last cell stops it). Each run returns rank 0's value, which the test reads from
the cell's output: the loss fell, and the ranks ended with the same weights (gathered with
``horovod.tensorflow.allgather_object`` inside ``train``: Horovod's ``horovod.tensorflow.keras``
has no object collectives) although they started from different ones and trained
on different data.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS / "distributor"))
from spark_clusters import SPARK_TEST_ENV, mirror_spark_home  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install "
                                       "'horovod-compat[tensorflow]')")

SPARK_CELL = f'''\
# Databricks gives every notebook `spark`; here: a local[2] session, as the other Spark tests start it
import sys
sys.path.insert(0, {str(TESTS / "distributor")!r})
from spark_clusters import start_session, stop_session

spark = start_session("local[2]", "test_runner_keras")
'''

TRAIN_CELL = '''\
def train(epochs=4):
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd
    from horovod.tensorflow import allgather_object  # (horovod.tensorflow.keras has none)
    from sparkdl.horovod import log_to_driver

    hvd.init()
    # each rank its own shard of a linear problem, and its own initial weights: the broadcast
    # callback must make them equal, the distributed optimizer keep them so
    rng = np.random.default_rng(100 + hvd.rank())
    w_true = np.linspace(-1.0, 1.0, 8, dtype="float32").reshape(8, 1)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = x @ w_true + 0.01 * rng.normal(size=(512, 1)).astype("float32")
    tf.keras.utils.set_random_seed(hvd.rank())
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)),
                                 tf.keras.layers.Dense(16, activation="tanh"),
                                 tf.keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.02 * hvd.size(), momentum=0.9))
    model.compile(loss="mse", optimizer=opt)
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    final = float(model.evaluate(x, y, verbose=0))
    weights = allgather_object([w.tolist() for w in model.get_weights()])
    equal = all(np.array_equal(np.asarray(a), np.asarray(b))
                for other in weights[1:] for a, b in zip(weights[0], other))
    log_to_driver(f"rank {hvd.rank()} of {hvd.size()}: loss {history.history['loss'][0]:.4f} -> {final:.4f}")
    return {"rank": hvd.rank(), "size": hvd.size(), "losses": history.history["loss"],
            "final": final, "weights_equal": equal, "keras": tf.keras.__version__,
            "in_spark_task": allgather_object(_in_spark_task())}


def _in_spark_task():
    """Whether an ancestor of this process is a PySpark worker (the rank runs in a Spark task)."""
    import os

    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
            return True
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return False
'''

RUN_CELL = '''\
import json
from sparkdl import HorovodRunner

result = HorovodRunner(np={np}).run(train, epochs=4)
print("RESULT np={np}", json.dumps(result))
'''

STOP_CELL = "stop_session(spark)\n"


def _stream(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _errors(cell):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.timeout(420)
def test_keras_train_function_in_a_notebook_through_horovodrunner(tmp_path, monkeypatch):
    for key, value in {**SPARK_TEST_ENV, "SPARK_HOME": str(mirror_spark_home(tmp_path)),
                       "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)  # the kernel, its JVM and the ranks inherit them
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)  # TensorFlow's default: Keras 3
    cells = [SPARK_CELL, TRAIN_CELL, RUN_CELL.format(np=-2), RUN_CELL.format(np=2), STOP_CELL]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    # allow_errors: the last cell (stop the session) runs whatever happened before it
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in notebook.cells:
        assert not _errors(cell), "\n".join(e["ename"] + ": " + e["evalue"] + "\n" + "\n".join(e["traceback"])
                                            for e in _errors(cell))
    for np_, cell in ((-2, notebook.cells[2]), (2, notebook.cells[3])):
        out = _stream(cell)
        line = next((x for x in out.splitlines() if x.startswith(f"RESULT np={np_} ")), None)
        assert line, out
        result = json.loads(line.split(" ", 2)[2])
        assert result["rank"] == 0 and result["size"] == 2, result
        assert result["keras"].startswith("3."), result  # Keras 3, TensorFlow's default
        losses = result["losses"]
        assert len(losses) == 4 and losses[-1] < losses[0] / 4, result
        assert result["final"] < losses[0] / 4, result
        assert result["weights_equal"] is True, result
        # np=-2: both ranks on the driver; np=2: both in the tasks of one Spark barrier stage
        assert result["in_spark_task"] == [np_ > 0] * 2, result
        # log_to_driver reaches the notebook from both ranks (with np=2 it is all that does)
        assert "rank 0 of 2: loss" in out and "rank 1 of 2: loss" in out, out
