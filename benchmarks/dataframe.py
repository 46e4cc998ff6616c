"""Training on DataFrames: our data path, TorchModel.transform and fit, each beside its reference.

On one `local[2]` session and one DataFrame (`--rows` rows of a 32-value vector and a label):

1. rows/s delivered into the training loop by one rank (`DataFrameShard.batches`, shuffled, as
   torch tensors) vs pyarrow reading the same Parquet files in a loop (`iter_batches` to numpy,
   no shuffle, no tensors) -- target >= 0.8x;
2. `TorchModel.transform` rows/s (Arrow batches) vs a row-at-a-time Python UDF doing the same
   prediction with the same model on the same cached rows and producing the same column, both
   after a warm-up that starts the Python workers and checks the two agree -- target >= 10x;
3. wall time of one `TorchEstimator.fit` epoch (2 ranks) vs PySpark's
   `TorchDistributor._train_on_dataframe` training the same model for one epoch with DDP on the
   same data (2 partitions, as it requires).

Usage: ``python benchmarks/dataframe.py [--rows 200000]``
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WIDTH = 32
BATCH = 256
ROUNDS = 5
EPOCHS = 5


def make_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def pyspark_train(rows_per_rank: int, batch_size: int) -> int:
    """PySpark's side: one DDP epoch over the rank's partition with its data loader."""
    import torch
    import torch.distributed as dist
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = 0
    for features, label in _get_spark_partition_data_loader(rows_per_rank, batch_size, num_workers=0):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(features.float()).squeeze(1), label.float())
        loss.backward()
        optimizer.step()
        seen += len(label)
    dist.destroy_process_group()
    return seen


def _session():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("benchmark-dataframe")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _dataframe(spark, rows: int):
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    values = F.array(*[(F.col("id") * (i + 1) % 97 / 97.0).cast("double") for i in range(WIDTH)])
    return spark.range(rows).select(array_to_vector(values).alias("features"),
                                    ((F.col("id") % 13) / 13.0).alias("y"))


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f} rows/s"


def bench_data_path(df, folder: str) -> List[tuple]:
    """Each timed run is `EPOCHS` passes over the data (our shuffled side: `EPOCHS` epochs, each a
    new shuffle), so that a run lasts long enough (~0.5 s) for a shared machine's jitter to
    matter less; the three sides run in alternating order, `ROUNDS` times after a warm-up
    round, and the best run of each is reported."""
    import numpy as np
    import pyarrow.parquet as pq

    from distributor.dataframe import ShardSpec, prepare_dataframe
    from distributor.shards import column_to_numpy, list_parquet_files

    path = os.path.join(folder, "data")
    _, rows = prepare_dataframe(df, path, 2)
    files = list_parquet_files(path)
    import torch  # noqa: F401 - imported before timing (DataFrameShard yields tensors)

    def ours(shuffle: bool) -> int:
        shard = ShardSpec(path, ("features", "y"), BATCH, shuffle=shuffle).open(0, 1)
        return sum(len(batch["y"]) for epoch in range(EPOCHS) for batch in shard.batches(epoch))

    def pyarrow_loop() -> int:
        count = 0
        for _ in range(EPOCHS):
            for name in files:
                for batch in pq.ParquetFile(name).iter_batches(batch_size=BATCH, columns=["features", "y"]):
                    features = column_to_numpy(batch.column(0))
                    label = np.asarray(batch.column(1))
                    count += len(label) + 0 * features.shape[0]
        return count

    timings: dict = {"shuffled": [], "in order": [], "pyarrow": []}
    runs = {"shuffled": lambda: ours(True), "in order": lambda: ours(False), "pyarrow": pyarrow_loop}
    for round_ in range(ROUNDS + 1):  # round 0 warms the page cache and the allocators
        for name in (list(runs) if round_ % 2 else list(runs)[::-1]):
            start = time.perf_counter()
            assert runs[name]() == rows * EPOCHS
            if round_:
                timings[name].append(time.perf_counter() - start)
    label = f"best of {ROUNDS} runs of {EPOCHS} epochs"
    return [(f"ours, shuffled ({label})", rows * EPOCHS, min(timings["shuffled"])),
            (f"ours, in order ({label})", rows * EPOCHS, min(timings["in order"])),
            (f"pyarrow iter_batches loop ({label})", rows * EPOCHS, min(timings["pyarrow"]))]


def bench_transform(df) -> List[tuple]:
    """`TorchModel.transform` vs a row-at-a-time Python UDF: the same model, the same cached
    DataFrame, the same session, the same output column (`y__output`, a double), both written to
    Spark's `noop` sink. A warm-up on a 2-partition sample starts both Python workers, imports
    torch there and checks that both sides predict the same values; then ours is timed 3 times
    (the median is reported) and the row UDF once (it runs ~50x longer, so its own jitter
    averages out)."""
    import statistics

    import torch
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from horovod_compat.spark.torch.estimator import TorchModel

    model = make_model().eval()
    torch_model = TorchModel(model=model, feature_columns=["features"], label_columns=["y"])

    def predict_row(vector) -> float:  # what a row-at-a-time UDF does: the model loaded once
        with torch.no_grad():
            return float(model(torch.from_numpy(vector.toArray()).float()[None])[0, 0])

    row_udf = F.udf(predict_row, T.DoubleType())
    cached = df.cache()
    rows = cached.count()

    def ours() -> None:
        torch_model.transform(cached).write.format("noop").mode("overwrite").save()

    def theirs() -> None:
        cached.withColumn("y__output", row_udf("features")).write.format("noop").mode("overwrite").save()

    sample = cached.sample(fraction=min(1.0, 4000 / max(rows, 1)), seed=1)
    both = torch_model.transform(sample).withColumn("row_udf", row_udf("features"))
    gap = both.agg(F.max(F.abs(F.col("y__output") - F.col("row_udf")))).collect()[0][0]
    if gap is None or gap > 1e-5:
        raise AssertionError(f"transform and the row UDF disagree (largest difference {gap})")
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        ours()
        timings.append(time.perf_counter() - start)
    start = time.perf_counter()
    theirs()
    row_seconds = time.perf_counter() - start
    cached.unpersist()
    return [("TorchModel.transform (Arrow batches, median of 3)", rows, statistics.median(timings)),
            ("row-at-a-time Python UDF, same model and rows", rows, row_seconds)]


def bench_fit(df, folder: str) -> List[tuple]:
    import torch
    from pyspark.ml.torch.distributor import TorchDistributor as PySparkTorchDistributor

    import horovod.spark.torch as hvd
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store

    rows = df.count()
    model = make_model()
    estimator = hvd.TorchEstimator(
        backend=SparkBackend(num_proc=2, stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w")),
        store=Store.create(os.path.join(folder, "store")), model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01), loss=torch.nn.MSELoss(),
        feature_cols=["features"], label_cols=["y"], label_shapes=[[-1, 1]], batch_size=BATCH,
        epochs=1, verbose=0, partitions_per_process=2)
    start = time.perf_counter()
    estimator.fit(df)
    ours = time.perf_counter() - start
    two = df.repartition(2).cache()
    two.count()
    start = time.perf_counter()
    seen = PySparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False)._train_on_dataframe(
        pyspark_train, two, rows // 2, BATCH)
    theirs = time.perf_counter() - start
    two.unpersist()
    return [("TorchEstimator.fit, 1 epoch (ours)", rows, ours),
            (f"PySpark _train_on_dataframe, 1 epoch ({seen} rows on rank 0)", rows, theirs)]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args(argv)
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = _session()
    try:
        df = _dataframe(spark, args.rows)
        with tempfile.TemporaryDirectory() as folder:
            sections = [("Data into the training loop (one rank, whole dataset)", bench_data_path(df, folder)),
                        ("Prediction", bench_transform(df)),
                        ("Training one epoch, 2 ranks on local[2]", bench_fit(df, folder))]
    finally:
        spark.stop()
    print(f"\nbenchmarks/dataframe.py --rows {args.rows}")
    for title, results in sections:
        print(f"\n{title}")
        print(f"  {'what':58s} {'rows':>9s} {'seconds':>8s} {'rate':>16s}")
        for name, rows, seconds in results:
            print(f"  {name:58s} {rows:9d} {seconds:8.2f} {_rate(rows, seconds):>16s}")
    data, pred, fit = (r for _, r in sections)
    print("\nRatios")
    print(f"  data path, shuffled / pyarrow loop:   {data[2][2] / data[0][2]:.2f}x (target >= 0.8)")
    print(f"  data path, in order / pyarrow loop:   {data[2][2] / data[1][2]:.2f}x")
    transform_ratio = (pred[0][1] / pred[0][2]) / (pred[1][1] / pred[1][2])
    print(f"  transform / row-at-a-time UDF:        {transform_ratio:.1f}x (target >= 10)")
    print(f"  fit time, PySpark / ours:             {fit[1][2] / fit[0][2]:.2f}x (above 1: ours faster)")


if __name__ == "__main__":
    main()
