"""horovod.spark.torch TorchEstimator / TorchModel on a real local[2] Spark: fit and transform
with vector and array columns, validation by fraction and by column, sample weights, resume
from a checkpoint, a rank's Spark Python worker lost mid-fit, and the bad inputs that must fail
before any rank starts."""
from __future__ import annotations

import io
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the Spark estimators need pyarrow: pip install horovod-compat[spark]")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
import spark_clusters  # noqa: E402
from spark_clusters import python_worker_of, shared_session  # noqa: E402
from procs import ranks_left_after  # noqa: E402

from horovod.spark.common.backend import Backend, SparkBackend  # noqa: E402
from horovod.spark.common.store import FilesystemStore, LocalStore, Store  # noqa: E402

import cloudpickle  # noqa: E402

# The ranks cannot import this test module or spark_clusters: their model classes and helpers
# travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(spark_clusters)


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark local[2]")


@pytest.fixture(scope="module")
def spark(request):
    with shared_session(request) as session:  # local[2], shared with the other local[2] modules
        yield session


def linear_rows(n=240):
    """y = 2*a - b + 0.5*c, with (a, b) a vector and c an array of one value."""
    from pyspark.ml.linalg import Vectors

    rows = []
    for i in range(n):
        a, b, c = (i % 7) / 7, (i % 5) / 5, (i % 3) / 3
        rows.append((i, Vectors.dense([a, b]), [c], 2 * a - b + 0.5 * c, 1.0 + (i % 2), i % 4 == 0))
    return rows


def linear_df(spark, n=240):
    return spark.createDataFrame(linear_rows(n), ["id", "vec", "arr", "y", "w", "is_val"])


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, vec, arr):
        return self.linear(torch.cat([vec, arr], dim=1))


def estimator(store, **overrides):
    import horovod.spark.torch as hvd

    torch.manual_seed(0)
    model = TwoInputs()
    params = dict(backend=SparkBackend(num_proc=2), store=store, model=model,
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
                  loss=torch.nn.MSELoss(), feature_cols=["vec", "arr"], label_cols=["y"],
                  label_shapes=[[-1, 1]], batch_size=8, epochs=3, verbose=1, random_seed=1)
    params.update(overrides)
    return hvd.TorchEstimator(**params)


def test_fit_transform_and_validation_fraction(spark, tmp_path, capfd):
    store = Store.create(str(tmp_path / "store"))
    assert type(store) is FilesystemStore
    est = estimator(store, validation=0.25, run_id="run_a", epochs=2)
    assert est.getBatchSize() == 8 and est.getRunId() == "run_a" and est.getValidation() == 0.25
    model = est.fit(linear_df(spark))
    history = model.getHistory()
    assert [h["epoch"] for h in history] == [0, 1]
    assert history[1]["train"]["loss"] < history[0]["train"]["loss"]
    assert "validation" in history[0]
    # The checkpoint: a plain state dict (no DDP "module." prefix) under <prefix>/runs/<run_id>/.
    path = tmp_path / "store" / "runs" / "run_a" / "checkpoint"
    state = torch.load(io.BytesIO(path.read_bytes()), weights_only=False)
    assert set(state["model"]) == set(TwoInputs().state_dict()) and state["epoch"] == 1
    assert isinstance(model.getOptimizer(), torch.optim.SGD)
    assert model.getOptimizer().param_groups[0]["params"][0] is next(model.getModel().parameters())

    predicted = model.setOutputCols(["y_hat"]).transform(linear_df(spark)).orderBy("id").collect()
    assert len(predicted) == 240 and isinstance(predicted[0]["y_hat"], float)
    err = sum((r["y_hat"] - r["y"]) ** 2 for r in predicted) / len(predicted)
    expected = model.getModel()(torch.zeros(1, 2), torch.zeros(1, 1)).item()
    assert predicted[0]["y_hat"] == pytest.approx(expected, abs=1e-5)
    assert err < 0.5


def _parameters(model):
    return [p.detach().clone() for p in model.getModel().parameters()]


def test_fit_again_on_a_run_with_a_checkpoint_trains_epochs_more_as_horovod(spark, tmp_path, capfd):
    """Horovod's TorchEstimator: a fit whose run_id has a checkpoint loads model and optimizer
    from it and trains `epochs` epochs more, its history numbered from 0 again. Two fits of 2
    epochs (momentum included) make the model that one fit of 4 epochs makes."""
    store = Store.create(str(tmp_path / "store"))

    def fit(run_id, epochs):
        torch.manual_seed(0)
        model = TwoInputs()
        return estimator(store, model=model, run_id=run_id, epochs=epochs, validation=0.25,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
                         ).fit(linear_df(spark))

    straight = fit("four_at_once", 4)
    first = fit("two_and_two", 2)
    capfd.readouterr()
    second = fit("two_and_two", 2)
    out = capfd.readouterr().out
    assert "Resuming training from last checkpoint" in out
    assert "Resuming run two_and_two from its checkpoint after 2 epoch(s): training 2 more" in out

    assert [h["epoch"] for h in first.getHistory()] == [0, 1]
    assert [h["epoch"] for h in second.getHistory()] == [0, 1]
    for resumed, once in zip(second.getHistory(), straight.getHistory()[2:]):
        assert resumed["train"]["loss"] == pytest.approx(once["train"]["loss"], rel=1e-5)
        assert resumed["validation"]["loss"] == pytest.approx(once["validation"]["loss"], rel=1e-5)
    for resumed, once in zip(_parameters(second), _parameters(straight)):
        torch.testing.assert_close(resumed, once, rtol=1e-5, atol=1e-6)
    assert not all(torch.equal(a, b) for a, b in zip(_parameters(first), _parameters(second)))
    # the momentum buffers went on from the checkpoint too
    for resumed, once in zip(second.getOptimizer().state_dict()["state"].values(),
                             straight.getOptimizer().state_dict()["state"].values()):
        torch.testing.assert_close(resumed["momentum_buffer"], once["momentum_buffer"],
                                   rtol=1e-5, atol=1e-6)
    path = tmp_path / "store" / "runs" / "two_and_two" / "checkpoint"
    state = torch.load(io.BytesIO(path.read_bytes()), weights_only=False)
    assert state["epoch"] == 3 and [h["epoch"] for h in state["history"]] == [0, 1]


def test_validation_column_sample_weights_and_sparse_vectors(spark, tmp_path):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import functions as F

    to_sparse = F.udf(lambda v: Vectors.sparse(2, {i: x for i, x in enumerate(v) if x}), VectorUDT())
    df = linear_df(spark).withColumn("vec", to_sparse("vec"))
    est = estimator(Store.create(f"file://{tmp_path}/store"), validation="is_val",
                    sample_weight_col="w", loss=torch.nn.MSELoss(reduction="none"), epochs=2)
    model = est.fit(df)
    assert "validation" in model.getHistory()[-1]
    # Validation rows (is_val) were written apart from the training rows.
    import pyarrow.parquet as pq

    val = list((tmp_path / "store").glob("intermediate_val_data.*"))
    train = list((tmp_path / "store").glob("intermediate_train_data.*"))
    assert len(val) == len(train) == 1
    assert pq.read_table(str(val[0])).num_rows == 60 and pq.read_table(str(train[0])).num_rows == 180
    out = model.transform(df)
    assert out.count() == 240 and "y__output" in out.columns


def test_classifier_outputs_become_vectors(spark, tmp_path):
    from pyspark.ml.linalg import DenseVector

    df = linear_df(spark).selectExpr("id", "vec", "arr", "CAST(id % 2 AS LONG) AS cls")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LogSoftmax(dim=1))
    import horovod.spark.torch as hvd

    est = hvd.TorchEstimator(num_proc=2, store=LocalStore(str(tmp_path)), model=model,
                             optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
                             loss=torch.nn.NLLLoss(), feature_cols=["vec"], label_cols=["cls"],
                             batch_size=16, epochs=1, metrics=[])
    row = est.fit(df).transform(df).first()
    assert isinstance(row["cls__output"], DenseVector) and len(row["cls__output"]) == 2


def recording_minibatch_fn(folder):
    """Horovod's default training step as a train_minibatch_fn, which also appends
    (batch_idx, rows, the parameters before the step, the labels) to <folder>/rank<N>.jsonl."""
    def train_minibatch(model, optimizer, transform_outputs, loss_fn, inputs, labels,
                        sample_weights, backward_passes_per_step, batch_idx):
        import json
        import os

        import torch.distributed as dist

        params = [round(float(v), 6) for p in model.parameters() for v in p.detach().reshape(-1)]
        with open(os.path.join(folder, f"rank{dist.get_rank()}.jsonl"), "a") as out:
            out.write(json.dumps([batch_idx, len(labels[0]), params, labels[0].tolist()]) + "\n")
        if batch_idx % backward_passes_per_step == 0:
            if batch_idx != 0:
                optimizer.step()
            optimizer.zero_grad()
        outputs, labels = transform_outputs(model(*inputs), labels)
        loss = loss_fn(outputs, labels, sample_weights)
        loss.backward()
        return outputs, loss
    return train_minibatch


def test_train_minibatch_fn_runs_every_batch_with_averaged_steps(spark, tmp_path):
    import json

    record = tmp_path / "calls"
    record.mkdir()
    est = estimator(Store.create(str(tmp_path / "store")), label_shapes=None, epochs=3,
                    train_minibatch_fn=recording_minibatch_fn(str(record)),
                    transformation_fn=lambda frame: frame.assign(y=frame["y"] * 0 + 3.0))
    history = est.fit(linear_df(spark)).getHistory()
    assert history[-1]["train"]["loss"] < history[0]["train"]["loss"]
    calls = {r: [json.loads(line) for line in (record / f"rank{r}.jsonl").read_text().splitlines()]
             for r in (0, 1)}
    # 120 rows per rank in batches of 8: 15 calls per epoch, batch_idx 0..14, every row once.
    for rank_calls in calls.values():
        assert [c[0] for c in rank_calls] == list(range(15)) * 3
        assert sum(c[1] for c in rank_calls) == 3 * 120
        # transformation_fn reached every batch.
        assert {v for c in rank_calls for v in c[3]} == {3.0}
    # The optimizer averaged the gradients over the ranks: both hold the same model at every call,
    # though each trained on its own rows, and it changed from epoch to epoch.
    assert [c[2] for c in calls[0]] == [c[2] for c in calls[1]]
    assert calls[0][0][2] != calls[0][15][2] != calls[0][30][2]


from horovod.spark.common.datamodule import DataModule  # noqa: E402


class ParquetRows(DataModule):
    """A data module as a user writes one: every shard_count-th row of the Parquet data from
    cur_shard on, in batches of (features dict, label), for all the epochs; it records what it
    was built with in <record>/rank<N>.json."""

    record = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        import json
        import os

        shown = {k: kwargs[k] for k in ("cur_shard", "shard_count", "train_batch_size",
                                        "steps_per_epoch_train", "steps_per_epoch_val", "has_val",
                                        "num_train_epochs", "label_cols", "feature_cols")}
        with open(os.path.join(self.record, f"rank{self.cur_shard}.json"), "w") as out:
            json.dump(shown, out)

    def _batches(self, folder, size, steps):
        import pyarrow.parquet as pq

        table = pq.read_table(folder).to_pydict()
        mine = range(self.cur_shard, len(table["y"]), self.shard_count)
        rows = [{k: table[k][i] for k in ("vec", "arr", "y")} for i in mine]
        for _ in range(self.num_train_epochs * steps):
            batch, rows = rows[:size], rows[size:] + rows[:size]
            features = {"vec": torch.tensor([r["vec"] for r in batch]),
                        "arr": torch.tensor([r["arr"] for r in batch])}
            yield features, torch.tensor([r["y"] for r in batch], dtype=torch.float64)

    def train_data(self):
        return self._batches(self.train_dir, self.train_batch_size, self.steps_per_epoch_train)

    def val_data(self):
        return self._batches(self.val_dir, self.val_batch_size, self.steps_per_epoch_val)


def test_data_module_feeds_every_rank(spark, tmp_path):
    import json

    record = tmp_path / "built"
    record.mkdir()
    module = type("RecordedParquetRows", (ParquetRows,), {"record": str(record)})
    est = estimator(Store.create(str(tmp_path / "store")), data_module=module, validation=0.25)
    history = est.fit(linear_df(spark)).getHistory()
    assert history[-1]["train"]["loss"] < history[0]["train"]["loss"] and "validation" in history[0]
    built = [json.loads((record / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(b["cur_shard"], b["shard_count"]) for b in built] == [(0, 2), (1, 2)]
    # Every rank takes the same steps: ceil(training rows / (8 rows * 2 ranks)).
    assert built[0]["steps_per_epoch_train"] == built[1]["steps_per_epoch_train"] >= 11
    assert built[0]["has_val"] and built[0]["num_train_epochs"] == 3 and built[0]["label_cols"] == ["y"]
    from horovod_compat.spark.common.estimator import EstimatorError

    with pytest.raises(EstimatorError, match="data_module must be a class .* instance of str"):
        bad_estimator(Store.create(str(tmp_path / "store")), data_module="petastorm").fit(linear_df(spark, 8))


def test_save_and_load_estimator_model_and_pipeline(spark, tmp_path):
    from pyspark.ml import PipelineModel

    import horovod.spark.torch as hvd

    store = Store.create(str(tmp_path / "store"))
    est = estimator(store, epochs=1, validation=0.25, run_id="saved")
    est.save(str(tmp_path / "store" / "estimator"))  # through the store: one metadata file
    assert (tmp_path / "store" / "estimator" / "metadata").is_file()
    loaded = hvd.TorchEstimator.load(str(tmp_path / "store" / "estimator"))
    assert type(loaded) is hvd.TorchEstimator and loaded.uid == est.uid
    assert (loaded.getBatchSize(), loaded.getFeatureCols(), loaded.getValidation(), loaded.getRunId()) == \
        (8, ["vec", "arr"], 0.25, "saved")
    assert loaded.getStore() is None and loaded.getBackend() is None  # given again, as in Horovod
    assert loaded.getModel().state_dict()["linear.weight"].tolist() == \
        est.getModel().state_dict()["linear.weight"].tolist()
    # The optimizer, unpickled apart from the model, was rebuilt over the loaded model.
    assert loaded.getOptimizer().param_groups[0]["params"][0] is next(loaded.getModel().parameters())
    assert loaded.getOptimizer().param_groups[0]["lr"] == 0.2

    model = loaded.setStore(store).setBackend(SparkBackend(num_proc=2)).fit(linear_df(spark))
    model.save(str(tmp_path / "model"))  # no store: written through Spark
    again = hvd.TorchModel.load(str(tmp_path / "model"))
    assert again.getHistory() == model.getHistory() and again.getRunId() == "saved"
    assert again.getOptimizer().param_groups[0]["params"][0] is next(again.getModel().parameters())

    def predictions(transformer):
        return [r["y__output"] for r in transformer.transform(linear_df(spark, 40)).orderBy("id").collect()]

    expected = predictions(model)
    assert predictions(again) == expected
    PipelineModel([model]).save(str(tmp_path / "pipeline"))
    assert predictions(PipelineModel.load(str(tmp_path / "pipeline"))) == expected
    with pytest.raises(TypeError, match="holds a saved .*TorchModel, not a .*TorchEstimator"):
        hvd.TorchEstimator.load(str(tmp_path / "model"))


class CountsLoads(torch.nn.Module):
    """Predicts how many times the Python worker running it has unpickled a CountsLoads."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)

    def __setstate__(self, state):
        super().__setstate__(state)
        sys.horovod_compat_test_loads = getattr(sys, "horovod_compat_test_loads", 0) + 1

    def forward(self, x):
        return torch.full((len(x), 1), float(getattr(sys, "horovod_compat_test_loads", 0)))


def test_transform_unpickles_the_model_once_per_python_worker(spark):
    from horovod.spark.torch import TorchModel

    df = spark.range(0, 64, 1, 16).selectExpr("CAST(id AS DOUBLE) AS x", "CAST(0.0 AS DOUBLE) AS y")
    model = TorchModel(model=CountsLoads(), feature_columns=["x"], label_columns=["y"])
    loads = [r["y__output"] for r in model.transform(df).collect()]
    # 16 tasks on Spark's reused Python workers (2 at a time): each worker unpickled it once.
    assert len(loads) == 64 and set(loads) == {1.0}


class LosesItsPythonWorker(TwoInputs):
    """In rank 1, the 5th forward SIGKILLs the Spark Python worker whose task runs the rank
    (noting the time in the file `lost`): the rank goes with it."""

    def __init__(self, lost):
        super().__init__()
        self.lost, self.calls = lost, 0

    def forward(self, vec, arr):
        import os
        import signal
        import time

        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 5:  # (RANK: set in the ranks only)
            with open(self.lost, "w") as handle:
                handle.write(str(time.time()))
            os.kill(python_worker_of(os.getpid()), signal.SIGKILL)
            time.sleep(60)  # dies with it
        return super().forward(vec, arr)


def test_a_lost_python_worker_ends_a_fit_naming_its_rank(spark, tmp_path):
    """Rank 1's Spark Python worker is SIGKILLed mid-fit: fit() raises within the chaos tier's
    crash bound (10 s), naming rank 1 as lost, and no rank is left."""
    from distributor import RankFailedError

    lost, marker = tmp_path / "lost", f"HOROVOD_TEST_MARKER_{uuid.uuid4().hex}"
    model = LosesItsPythonWorker(str(lost))
    est = estimator(Store.create(str(tmp_path / "store")), model=model,
                    optimizer=torch.optim.SGD(model.parameters(), lr=0.2), epochs=20,
                    backend=SparkBackend(num_proc=2, env={"HOROVOD_TEST_MARKER": marker}))
    with pytest.raises(RankFailedError) as info:
        est.fit(linear_df(spark))
    seconds = time.time() - float(lost.read_text())
    first = str(info.value).splitlines()[0]
    assert info.value.rank == 1 and "was lost" in first, str(info.value)[-3000:]
    assert seconds < 10, (seconds, first)
    assert ranks_left_after(marker) == [], "a rank outlived the fit"


class RecordingBackend(Backend):
    """A backend that fails the test if training is started."""

    def num_processes(self):
        return 2

    def run(self, fn, args=(), kwargs=None, env=None):
        raise AssertionError("training started despite bad input")


class _Captured(Exception):
    pass


class CapturingBackend(RecordingBackend):
    """A backend that keeps what the ranks would be sent, and starts nothing."""

    def run(self, fn, args=(), kwargs=None, env=None):
        self.payload = cloudpickle.dumps((fn, args, kwargs))
        raise _Captured


def test_a_rank_unpickles_its_training_config_without_importing_pyspark(spark, tmp_path):
    """The ranks read Parquet shards and train: the config they unpickle (model, store, the
    prepared data's paths) imports no pyspark (pyspark.ml alone is ~0.5 s of CPU per rank)."""
    backend = CapturingBackend()
    with pytest.raises(_Captured):
        estimator(Store.create(str(tmp_path / "store")), backend=backend).fit(linear_df(spark, 40))
    probe = ("import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))")
    done = subprocess.run([sys.executable, "-c", probe], input=backend.payload, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().strip() == "[]"


def bad_estimator(store, **overrides):
    return estimator(store, backend=RecordingBackend(), **overrides)


def test_bad_inputs_fail_before_training(spark, tmp_path):
    from horovod_compat.spark.common.estimator import EstimatorError
    from horovod_compat.spark.common.store import StoreError

    df = linear_df(spark, 40).selectExpr("*", "CAST(id AS STRING) AS name")
    store = Store.create(str(tmp_path / "store"))
    with pytest.raises(EstimatorError, match=r"no feature column 'missing'.*columns are"):
        bad_estimator(store, feature_cols=["missing", "arr"]).fit(df)
    with pytest.raises(EstimatorError, match=r"Feature column 'name' has Spark type string"):
        bad_estimator(store, feature_cols=["name", "arr"]).fit(df)
    wide = torch.nn.Linear(2, 3)
    with pytest.raises(EstimatorError, match=r"output of shape \(2, 3\) does not match label column 'vec'"):
        bad_estimator(store, model=wide, optimizer=torch.optim.SGD(wide.parameters(), lr=0.1),
                      feature_cols=["vec"], label_cols=["vec"], label_shapes=None).fit(df)
    with pytest.raises(EstimatorError, match=r"model failed on a batch of 2 rows"):
        bad_estimator(store, input_shapes=[[-1, 5], [-1, 1]]).fit(df)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot write under"):
        bad_estimator(Store.create(str(blocker / "store"))).fit(df)
    with pytest.raises(TypeError, match=r"unknown parameter\(s\) 'batchsize' \(did you mean 'batch_size'\?\)"):
        estimator(store, batchsize=3)
    with pytest.raises(EstimatorError, match="validation must be a fraction"):
        bad_estimator(store, validation=1.5).fit(df)
    with pytest.raises(EstimatorError, match="train_minibatch_fn must be a function, got str"):
        bad_estimator(store, train_minibatch_fn="sgd").fit(df)
    with pytest.raises(EstimatorError, match=r"batch_size=1 needs the 39 training rows to split evenly"):
        bad_estimator(store, train_minibatch_fn=recording_minibatch_fn(str(tmp_path)),
                      batch_size=1).fit(df.limit(39))
