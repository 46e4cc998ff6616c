"""horovod.spark.keras KerasEstimator / KerasModel on a real local[2] Spark: fit with 2 ranks
(horovod.tensorflow.keras, Keras 3), history and checkpoint, transform against the returned
model's predict, bad inputs that fail before any rank starts, and Horovod's
examples/spark/keras/keras_spark_mnist.py run unchanged on a synthetic MNIST."""
from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow", reason="the Spark estimators need pyarrow: pip install horovod-compat[spark]")
for _name in ("keras", "tensorflow"):
    if importlib.util.find_spec(_name) is None:
        pytest.skip(f"{_name} is not installed (pip install 'horovod-compat[tensorflow]')",
                    allow_module_level=True)


def keras_module():
    """``keras``, imported at first use: collecting this file on a pytest worker that never runs
    it (tests/scheduling.py gives it to one) costs no TensorFlow import (5-7 s of CPU)."""
    return importlib.import_module("keras")


sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
sys.path.insert(0, str(Path(__file__).parents[1]))
from spark_clusters import SPARK_TEST_ENV, SUBMIT_ARGS, mirror_spark_home, shared_session  # noqa: E402
from tf_support import write_mnist_libsvm  # noqa: E402
from tiers import CI  # noqa: E402

from horovod.spark.common.backend import Backend, SparkBackend  # noqa: E402
from horovod.spark.common.store import Store  # noqa: E402


def flavors(ci: str):
    """Parametrize `flavor` with Keras 3 and tf-keras; CI runs `ci`'s only, the long round both
    (docs/testing.md)."""
    return pytest.mark.parametrize("flavor", [
        pytest.param(name, marks=() if name == ci else pytest.mark.skipif(CI, reason=(
            f"the long round's: CI runs this one under {ci} (each Keras once in this file), "
            "without CI=true both run")))
        for name in ("keras3", "tf_keras")])

UPSTREAM = Path(os.environ.get(
    "HOROVOD_UPSTREAM_DIR", Path(__file__).resolve().parents[3] / "shared" / "upstream" / "horovod-0.28.1"
))
EXAMPLE = UPSTREAM / "examples" / "spark" / "keras" / "keras_spark_mnist.py"


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark local[2]")


@pytest.fixture(scope="module")
def spark(request):
    with shared_session(request) as session:  # local[2], shared with the other local[2] modules
        yield session


def linear_rows(n=240):
    """y = 2*a - b + 0.5*c, the features (a, b, c) one vector column."""
    from pyspark.ml.linalg import Vectors

    rows = []
    for i in range(n):
        a, b, c = (i % 7) / 7, (i % 5) / 5, (i % 3) / 3
        rows.append((i, Vectors.dense([a, b, c]), 2 * a - b + 0.5 * c))
    return rows


def linear_df(spark, n=240):
    return spark.createDataFrame(linear_rows(n), ["id", "features", "y"])


def estimator(store, flavor=None, **overrides):
    """A KerasEstimator of a linear model; ``flavor``: the Keras module (Keras 3 by default, or
    tf_keras for a tf-keras model)."""
    import horovod.spark.keras as hvd

    flavor = flavor or keras_module()
    flavor.utils.set_random_seed(0)
    model = flavor.Sequential([flavor.Input(shape=(3,)), flavor.layers.Dense(1)])
    params = dict(backend=SparkBackend(num_proc=2), store=store, model=model,
                  optimizer=flavor.optimizers.SGD(0.1), loss="mse", metrics=["mae"],
                  feature_cols=["features"], label_cols=["y"], batch_size=8, epochs=3,
                  verbose=2, random_seed=1)
    params.update(overrides)
    return hvd.KerasEstimator(**params)


@pytest.mark.timeout(300)
def test_fit_and_transform_with_two_ranks(spark, tmp_path):
    from horovod.spark.keras import KerasModel

    store = Store.create(str(tmp_path / "store"))
    est = estimator(store, validation=0.25, run_id="keras_run")
    assert est.getBatchSize() == 8 and est.getCustomObjects() == {} and est.getRunId() == "keras_run"
    model = est.fit(linear_df(spark))
    assert isinstance(model, KerasModel)

    history = model.getHistory()
    assert set(history) >= {"loss", "mae", "val_loss", "val_mae"}
    assert all(len(v) == 3 for v in history.values())
    assert history["loss"][-1] < history["loss"][0]
    assert history["loss"][-1] < 0.2
    # Horovod's layout: the run's checkpoint under <prefix>/runs/<run_id>/checkpoint.
    state = pickle.loads((tmp_path / "store" / "runs" / "keras_run" / "checkpoint").read_bytes())
    assert state["epoch"] == 2 and state["history"]["loss"] == history["loss"]

    trained = model.getModel()
    assert isinstance(trained, keras_module().Model) and trained.optimizer is not None
    assert float(trained.optimizer.learning_rate.numpy()) == pytest.approx(0.1)  # unscaled again
    for w, saved in zip(trained.get_weights(), state["weights"]):
        np.testing.assert_allclose(w, saved)

    df = linear_df(spark, 60)
    rows = model.setOutputCols(["y_hat"]).transform(df).orderBy("id").collect()
    assert len(rows) == 60 and isinstance(rows[0]["y_hat"], float)
    features = np.array([r["features"].toArray() for r in rows], dtype=np.float32)
    expected = trained.predict(features, verbose=0)[:, 0]
    np.testing.assert_allclose([r["y_hat"] for r in rows], expected, rtol=1e-5, atol=1e-5)
    assert np.mean([(r["y_hat"] - r["y"]) ** 2 for r in rows]) < 0.2

    # save/load (Horovod's <path>/metadata; the Keras model saved as .keras bytes, not pickled)
    model.save(str(tmp_path / "keras_model"))
    loaded = KerasModel.load(str(tmp_path / "keras_model"))
    assert loaded.getHistory() == history and loaded.getOutputCols() == ["y_hat"]
    for w, saved in zip(loaded.getModel().get_weights(), trained.get_weights()):
        np.testing.assert_allclose(w, saved)
    again = loaded.transform(df).orderBy("id").collect()
    np.testing.assert_allclose([r["y_hat"] for r in again], expected, rtol=1e-5, atol=1e-5)
    est.save(str(tmp_path / "keras_estimator"))
    est_loaded = type(est).load(str(tmp_path / "keras_estimator"))
    assert est_loaded.getBatchSize() == 8 and est_loaded.getLoss() == "mse"
    assert isinstance(est_loaded.getModel(), keras_module().Model)
    assert isinstance(est_loaded.getOptimizer(), keras_module().optimizers.SGD)


class RecordingBackend(Backend):
    """A backend that fails the test if training is started."""

    def num_processes(self):
        return 2

    def run(self, fn, args=(), kwargs=None, env=None):
        raise AssertionError("training started despite bad input")


def test_bad_inputs_fail_before_training(spark, tmp_path):
    from horovod_compat.spark.common.estimator import EstimatorError

    store = Store.create(str(tmp_path / "store"))
    df = linear_df(spark, 40)
    with pytest.raises(EstimatorError, match=r"no feature column 'missing'.*columns are"):
        estimator(store, backend=RecordingBackend(), feature_cols=["missing"]).fit(df)
    with pytest.raises(EstimatorError, match=r"model has 1 input\(s\) but feature_cols names 2"):
        estimator(store, backend=RecordingBackend(), feature_cols=["features", "y"]).fit(df)
    keras = keras_module()
    wide = keras.Sequential([keras.Input(shape=(5,)), keras.layers.Dense(1)])
    with pytest.raises(EstimatorError, match=r"model failed on a batch of 2 rows"):
        estimator(store, backend=RecordingBackend(), model=wide).fit(df)
    with pytest.raises(EstimatorError, match=r"needs loss="):
        estimator(store, backend=RecordingBackend(), loss=None).fit(df)
    with pytest.raises(TypeError, match=r"unknown parameter\(s\) 'batchsize' \(did you mean 'batch_size'\?\)"):
        estimator(store, batchsize=3)


@pytest.mark.timeout(600)
@pytest.mark.skipif(not EXAMPLE.is_file(), reason=f"Horovod's upstream example is not at {EXAMPLE}")
@flavors(ci="tf_keras")
def test_upstream_keras_spark_mnist_example_runs_unchanged(tmp_path, flavor):
    """Under Keras 3 and under tf-keras (``TF_USE_LEGACY_KERAS=1``, as Keras 2 users run it): the
    driver builds and serializes the model with one, the ranks and ``transform`` load it with the
    same one."""
    if flavor == "tf_keras":
        pytest.importorskip("tf_keras", reason="tf-keras is not installed (scripts/bootstrap.sh "
                                               "installs it for the tests)")
    data_dir, work_dir = tmp_path / "data", tmp_path / "work"
    work_dir.mkdir()
    write_mnist_libsvm(data_dir / "mnist.bz2", rows=int(os.environ.get("KERAS_MNIST_ROWS", "400")))
    env = {**os.environ, **SPARK_TEST_ENV, "SPARK_HOME": str(mirror_spark_home(tmp_path)),
           "PYSPARK_SUBMIT_ARGS": SUBMIT_ARGS,
           "TF_USE_LEGACY_KERAS": "1" if flavor == "tf_keras" else "0"}
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--num-proc", "2", "--batch-size", "32", "--epochs", "3",
         "--data-dir", str(data_dir), "--work-dir", str(work_dir)],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the example did not finish:\n{out[-5000:]}")
    assert proc.returncode == 0, f"the example failed ({proc.returncode}):\n{out[-8000:]}"
    # Rank 0's Keras progress: the last loss shown in each epoch (progress bars or epoch lines).
    epochs = re.split(r"\[0\]<stdout>:Epoch \d+/3", out.split("Test accuracy")[0])[1:]
    losses = [float(re.findall(r"loss: ([0-9.]+)", e)[-1]) for e in epochs]
    assert len(losses) == 3 and losses[-1] < losses[0], out[-5000:]
    # the ranks ran the requested Keras: tf-keras draws its progress bar with "=", Keras 3 with "━"
    bars = "".join(epochs)
    assert ("[=====" in bars, "━━━━━" in bars) == (flavor == "tf_keras", flavor == "keras3"), \
        f"{flavor}: rank 0's progress bars are not that Keras':\n" + bars[-3000:]
    accuracy = float(re.search(r"Test accuracy: ([0-9.]+)", out).group(1))
    assert accuracy > 0.3, out[-3000:]
    checkpoints = list((work_dir / "runs").glob("*/checkpoint"))
    assert len(checkpoints) == 1, sorted(work_dir.rglob("*"))
    # The example's TensorBoard callback wrote to its relative `logs`: copied into the run's folder.
    assert list(checkpoints[0].parent.glob("logs/train/*")), sorted(work_dir.rglob("*"))


@pytest.mark.timeout(600)
@flavors(ci="keras3")
def test_fit_again_on_a_run_with_a_checkpoint_resumes_weights_and_optimizer_state(spark, tmp_path,
                                                                                   flavor):
    """Horovod's Keras estimator restores the checkpointed model with its optimizer: 2 epochs, then
    1 more on the same run, must give the weights of 3 epochs in one fit (Adam, whose moments and
    step count change every update, so a fresh optimizer on resume would not). With a tf-keras
    model the ranks run tf-keras (TF_USE_LEGACY_KERAS=1)."""
    module = keras_module() if flavor == "keras3" else pytest.importorskip(
        "tf_keras", reason="tf-keras is not installed (scripts/bootstrap.sh installs it for the tests)")
    store = Store.create(str(tmp_path / "store"))
    df = linear_df(spark)
    adam = dict(optimizer=module.optimizers.Adam(0.05), shuffle=True, flavor=module)
    straight = estimator(store, epochs=3, run_id="straight", **adam).fit(df)
    assert type(straight.getModel()).__module__.startswith(module.__name__)
    first = estimator(store, epochs=2, run_id="resumed", **adam).fit(df)
    assert len(first.getHistory()["loss"]) == 2
    state = pickle.loads((tmp_path / "store" / "runs" / "resumed" / "checkpoint").read_bytes())
    steps = int(state["optimizer"][0])  # the first optimizer variable: the step count
    assert steps > 0 and steps % 2 == 0, state["optimizer"][0]
    resumed = estimator(store, epochs=1, run_id="resumed", **adam).fit(df)
    assert len(resumed.getHistory()["loss"]) == 1
    state = pickle.loads((tmp_path / "store" / "runs" / "resumed" / "checkpoint").read_bytes())
    assert state["epoch"] == 2 and int(state["optimizer"][0]) == steps * 3 // 2
    for got, want in zip(resumed.getModel().get_weights(), straight.getModel().get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert resumed.getHistory()["loss"][0] == pytest.approx(straight.getHistory()["loss"][2], rel=1e-4)
