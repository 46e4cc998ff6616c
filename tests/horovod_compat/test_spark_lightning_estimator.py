"""horovod.spark.lightning TorchEstimator on a real local[2] Spark, with a LightningModule of
either flavour (pytorch_lightning.LightningModule and lightning.pytorch.LightningModule),
callbacks (ModelCheckpoint, EarlyStopping) and a profiler."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the Spark estimators need pyarrow: pip install horovod-compat[spark]")
torch = pytest.importorskip("torch")

import cloudpickle  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
from spark_clusters import shared_session  # noqa: E402

from horovod.spark.common.backend import SparkBackend  # noqa: E402
from horovod.spark.common.store import Store  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FLAVOURS = {
    "pytorch_lightning": "pytorch_lightning",
    "lightning.pytorch": "lightning.pytorch",
}


def flavour(name):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed (pip install {name.split('.')[0].replace('_', '-')})")


def make_module(pl):
    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, vec):
            return self.linear(vec)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self(batch["vec"]).squeeze(1), batch["y"])
            self.log("train_loss", loss, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self(batch["vec"]).squeeze(1), batch["y"])
            self.log("val_loss", loss, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.2)

    return Regressor


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark local[2]")


@pytest.fixture(scope="module")
def spark(request):
    with shared_session(request) as session:  # local[2], shared with the other local[2] modules
        yield session


def regression_df(spark, n=200):
    from pyspark.ml.linalg import Vectors

    rows = [(Vectors.dense([(i % 7) / 7, (i % 5) / 5]), 2 * (i % 7) / 7 - (i % 5) / 5) for i in range(n)]
    return spark.createDataFrame(rows, ["vec", "y"])


@pytest.mark.parametrize("package", list(FLAVOURS))
def test_lightning_module_fit_callbacks_profiler_and_transform(spark, tmp_path, package):
    pl = flavour(package)
    import horovod.spark.lightning as hvd

    torch.manual_seed(0)
    callbacks = [pl.callbacks.ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1),
                 pl.callbacks.EarlyStopping(monitor="val_loss", patience=5, mode="min")]
    est = hvd.TorchEstimator(backend=SparkBackend(num_proc=2), store=Store.create(str(tmp_path)),
                             model=make_module(pl)(), feature_cols=["vec"], label_cols=["y"],
                             batch_size=10, epochs=3, validation=0.2, callbacks=callbacks,
                             profiler="simple", run_id="lit", random_seed=3)
    model = est.fit(regression_df(spark))
    history = model.getHistory()
    assert [h["epoch"] for h in history] == [0, 1, 2]
    assert "val_loss" in history[-1] and history[-1]["train_loss"] < history[0]["train_loss"]
    run = tmp_path / "runs" / "lit"
    assert (run / "checkpoint").is_file()
    assert list(run.rglob("*.ckpt")), f"ModelCheckpoint's file was not copied to the run: {list(run.rglob('*'))}"
    rows = model.transform(regression_df(spark, 20)).collect()
    assert len(rows) == 20 and all(isinstance(r["y__output"], float) for r in rows)
    assert sum((r["y__output"] - r["y"]) ** 2 for r in rows) / 20 < 0.5


def test_fit_again_on_a_run_with_a_checkpoint_continues_to_epochs_as_lightning(spark, tmp_path, capfd):
    """Lightning's resume (Trainer.fit(ckpt_path=...)): `epochs` is max_epochs, the total; a fit
    on a run with a checkpoint trains only the epochs still missing and the history goes on.
    (TorchEstimator of horovod.spark.torch instead trains `epochs` more: test_spark_estimator.py.)"""
    pl = flavour("lightning.pytorch")
    import horovod.spark.lightning as hvd

    store = Store.create(str(tmp_path))

    def fit(epochs):
        torch.manual_seed(0)
        est = hvd.TorchEstimator(backend=SparkBackend(num_proc=2), store=store, model=make_module(pl)(),
                                 feature_cols=["vec"], label_cols=["y"], batch_size=10, epochs=epochs,
                                 validation=0.2, run_id="lit_resume", random_seed=3)
        model = est.fit(regression_df(spark))
        return model.getHistory(), [p.detach().clone() for p in model.getModel().parameters()]

    two, after_two = fit(2)
    capfd.readouterr()
    four, after_four = fit(4)
    assert "Resuming run lit_resume at epoch 2 from its checkpoint" in capfd.readouterr().out
    assert [h["epoch"] for h in four] == [0, 1, 2, 3] and four[:2] == two
    assert not any(torch.equal(a, b) for a, b in zip(after_two, after_four))
    again, after_again = fit(4)  # max_epochs reached: nothing left to train
    assert again == four
    assert all(torch.equal(a, b) for a, b in zip(after_four, after_again))


def test_lightning_1_hooks_and_plain_modules_are_refused_before_training(spark, tmp_path):
    pl = flavour("lightning.pytorch")
    import horovod.spark.lightning as hvd
    from horovod_compat.spark.common.estimator import EstimatorError

    class Legacy(make_module(pl)):
        def validation_epoch_end(self, outputs):
            pass

    common = dict(num_proc=2, store=Store.create(str(tmp_path)), feature_cols=["vec"], label_cols=["y"])
    with pytest.raises(EstimatorError, match=r"validation_epoch_end is Lightning 1 API.*on_validation_epoch_end"):
        hvd.TorchEstimator(model=Legacy(), **common).fit(regression_df(spark, 10))
    with pytest.raises(EstimatorError, match="trains a LightningModule"):
        hvd.TorchEstimator(model=torch.nn.Linear(2, 1), **common).fit(regression_df(spark, 10))


def make_data_module(pl, record):
    class ParquetShard(pl.LightningDataModule):
        """Every shard_count-th row of the Parquet data from cur_shard on, steps_per_epoch_* dict
        batches an epoch; records its keyword arguments in <record>/rank<N>.json."""

        def __init__(self, **kwargs):
            super().__init__()
            import json
            import os

            self.kwargs = kwargs
            with open(os.path.join(record, f"rank{kwargs['cur_shard']}.json"), "w") as out:
                json.dump({k: kwargs[k] for k in ("cur_shard", "shard_count", "train_batch_size",
                                                  "steps_per_epoch_train", "has_val")}, out)

        def _loader(self, folder, size, steps):
            import pyarrow.parquet as pq

            table = pq.read_table(folder).to_pydict()
            mine = list(range(self.kwargs["cur_shard"], len(table["y"]), self.kwargs["shard_count"]))
            batches = []
            for step in range(steps):
                rows = [mine[(step * size + i) % len(mine)] for i in range(size)]
                batches.append({"vec": torch.tensor([table["vec"][i] for i in rows]),
                                "y": torch.tensor([table["y"][i] for i in rows], dtype=torch.float32)})
            return torch.utils.data.DataLoader(batches, batch_size=None)

        def train_dataloader(self):
            k = self.kwargs
            return self._loader(k["train_dir"], k["train_batch_size"], k["steps_per_epoch_train"])

        def val_dataloader(self):
            k = self.kwargs
            return self._loader(k["val_dir"], k["val_batch_size"], k["steps_per_epoch_val"])

    return ParquetShard


def test_lightning_data_module(spark, tmp_path):
    import json

    pl = flavour("lightning.pytorch")
    import horovod.spark.lightning as hvd

    torch.manual_seed(0)
    record = tmp_path / "built"
    record.mkdir()
    est = hvd.TorchEstimator(backend=SparkBackend(num_proc=2), store=Store.create(str(tmp_path / "store")),
                             model=make_module(pl)(), feature_cols=["vec"], label_cols=["y"],
                             batch_size=10, epochs=3, validation=0.2, random_seed=3,
                             data_module=make_data_module(pl, str(record)))
    history = est.fit(regression_df(spark)).getHistory()
    assert "val_loss" in history[-1] and history[-1]["train_loss"] < history[0]["train_loss"]
    built = [json.loads((record / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(b["cur_shard"], b["shard_count"], b["train_batch_size"], b["has_val"]) for b in built] == \
        [(0, 2, 10, True), (1, 2, 10, True)]
    assert built[0]["steps_per_epoch_train"] == built[1]["steps_per_epoch_train"] >= 8
