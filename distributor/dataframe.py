"""Spark DataFrames as Parquet for the ranks: the driver side of the data path.

`inspect_columns` checks the columns a job reads before anything runs (present, numeric, no
nulls, arrays and vectors of one length) with a single aggregation; `write_parquet` writes them
with pyspark.ml vectors turned into float32 arrays, in files and row groups small enough for a
rank to stream (`distributor.shards` reads them back). `DataFrameShard` is what a rank of
`TorchDistributor.train_on_dataframe` gets: its share of the rows as batches of tensors.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .errors import LaunchValidationError

from .shards import ARRAY, SCALAR, VECTOR, ColumnInfo
#: Target size of one Parquet row group: what a rank holds in memory per row group it reads.
ROW_GROUP_BYTES = 4 * 1024 * 1024


_NUMPY_TYPES = {
    "BooleanType": "bool", "ByteType": "int8", "ShortType": "int16", "IntegerType": "int32",
    "LongType": "int64", "FloatType": "float32", "DoubleType": "float64",
}


def _numpy_dtype(data_type: Any) -> Optional[str]:
    name = type(data_type).__name__
    if name == "DecimalType":
        return "float64"
    return _NUMPY_TYPES.get(name)


def inspect_columns(df: Any, columns: Sequence[str], roles: Optional[Dict[str, str]] = None
                    ) -> Tuple[Dict[str, ColumnInfo], int]:
    """Check `columns` of `df` and describe them; also count the rows (one Spark job).

    `roles` names what each column is for ("feature", "label", ...) in the error messages.
    Raises `LaunchValidationError` saying what to change for a missing or non-numeric column,
    a column with nulls, or an array/vector column whose rows have different lengths.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    roles = roles or {}
    fields = {f.name: f for f in df.schema.fields}
    missing = [c for c in columns if c not in fields]
    if missing:
        described = ", ".join(f"{roles.get(c, 'column')} {c!r}" for c in missing)
        raise LaunchValidationError(
            f"The DataFrame has no {described}; its columns are {sorted(fields)}. Fix the column "
            "names passed to the estimator, or add the column to the DataFrame."
        )
    kinds: Dict[str, Tuple[str, str]] = {}
    for name in dict.fromkeys(columns):
        data_type = fields[name].dataType
        type_name = type(data_type).__name__
        if type_name == "VectorUDT":
            kinds[name] = (VECTOR, "float32")
        elif type_name == "ArrayType" and _numpy_dtype(data_type.elementType):
            kinds[name] = (ARRAY, _numpy_dtype(data_type.elementType))
        elif _numpy_dtype(data_type):
            kinds[name] = (SCALAR, _numpy_dtype(data_type))
        else:
            raise LaunchValidationError(
                f"{roles.get(name, 'column').capitalize()} {name!r} has Spark type "
                f"{data_type.simpleString()}, which cannot become a tensor. Training reads numeric "
                "columns, arrays of numbers and pyspark.ml vectors: convert it first (e.g. "
                "StringIndexer for categories, VectorAssembler for several numeric columns, or "
                "a cast)."
            )
    aggregates = [F.count(F.lit(1)).alias("__rows")]
    for i, (name, (kind, _)) in enumerate(kinds.items()):
        column = F.col(f"`{name}`")
        aggregates.append(F.sum(column.isNull().cast("long")).alias(f"n{i}"))
        if kind != SCALAR:
            size = F.size(vector_to_array(column) if kind == VECTOR else column)
            aggregates += [F.min(size).alias(f"lo{i}"), F.max(size).alias(f"hi{i}")]
    stats = df.agg(*aggregates).collect()[0].asDict()
    infos: Dict[str, ColumnInfo] = {}
    for i, (name, (kind, dtype)) in enumerate(kinds.items()):
        role = roles.get(name, "column").capitalize()
        if stats[f"n{i}"]:
            raise LaunchValidationError(
                f"{role} {name!r} has {stats[f'n{i}']} null value(s). Drop or fill them first "
                f"(df.na.drop(subset=[{name!r}]) or df.na.fill(...))."
            )
        size = 1
        if kind != SCALAR:
            lo, hi = stats[f"lo{i}"], stats[f"hi{i}"]
            if lo != hi:
                raise LaunchValidationError(
                    f"{role} {name!r} holds {kind}s of different lengths ({lo} to {hi} values); a "
                    "tensor needs the same length in every row. Pad or truncate them first."
                )
            size = int(hi or 0)
        infos[name] = ColumnInfo(name, kind, size, dtype, fields[name].dataType.simpleString())
    return infos, int(stats["__rows"])


def select_for_parquet(df: Any, infos: Dict[str, ColumnInfo], extra: Sequence[Any] = ()) -> Any:
    """`df` reduced to the described columns, vectors turned into float32 arrays."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    selected = []
    for name, info in infos.items():
        column = F.col(f"`{name}`")
        selected.append((vector_to_array(column, "float32") if info.kind == VECTOR else column).alias(name))
    return df.select(*selected, *extra)


def write_parquet(df: Any, path: str, num_files: int, infos: Dict[str, ColumnInfo],
                  partition_by: Optional[str] = None, row_group_bytes: int = ROW_GROUP_BYTES) -> None:
    """Write `df` as at least `num_files` Parquet files (per partition value) of at most about
    `row_group_bytes` of rows each: a file's rows are the most a rank holds of it at once."""
    import numpy as np

    row_bytes = sum(info.size * np.dtype(info.dtype).itemsize for info in infos.values()) or 8
    rows_per_file = max(256, row_group_bytes // row_bytes)
    writer = (df.repartition(num_files).write.mode("overwrite")
              .option("maxRecordsPerFile", rows_per_file)
              .option("parquet.block.size", row_group_bytes))
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.parquet(path)


@dataclass(frozen=True)
class ShardSpec:
    """Where a job's Parquet data is and how each rank reads it (picklable; sent to the ranks)."""

    path: str
    columns: Tuple[str, ...]
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    buffer_row_groups: int = 4
    filesystem: Any = None

    def open(self, rank: int, world_size: int) -> "DataFrameShard":
        from .shards import open_shard

        return DataFrameShard(open_shard(
            self.path, rank, world_size, self.columns, self.batch_size, self.shuffle, self.seed,
            self.buffer_row_groups, self.filesystem,
        ))


class DataFrameShard:
    """One rank's share of a DataFrame: `batches(epoch)` yields dicts of torch tensors by column.

    Every rank yields `steps` batches per epoch (the last may be smaller, or empty on a rank
    whose shard is one row shorter); iterating the shard itself gives epoch 0.
    """

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    @property
    def num_rows(self) -> int:
        return self.reader.num_rows

    @property
    def steps(self) -> int:
        return self.reader.steps

    def batches(self, epoch: int = 0) -> Iterator[Dict[str, Any]]:
        import torch

        for batch in self.reader.batches(epoch):
            yield {name: torch.from_numpy(values if values.flags.writeable else values.copy())
                   for name, values in batch.items()}

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self.batches(0)

    def __len__(self) -> int:
        return self.steps


#: The shard of the current rank while a `TorchDistributor._train_on_dataframe` function runs.
_current: List[DataFrameShard] = []


def current_shard() -> DataFrameShard:
    """This rank's `DataFrameShard` inside a function run by `TorchDistributor._train_on_dataframe`."""
    if not _current:
        raise RuntimeError(
            "No DataFrame shard: current_shard() works inside a function started by "
            "TorchDistributor._train_on_dataframe or train_on_dataframe."
        )
    return _current[0]


def run_on_shard(main: Any, spec: ShardSpec, pass_shard: bool, *args: Any, **kwargs: Any) -> Any:
    """A rank's entry point: open the rank's shard, then call `main` (with the shard first when
    `pass_shard`)."""
    shard = spec.open(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    _current[:] = [shard]
    try:
        return main(shard, *args, **kwargs) if pass_shard else main(*args, **kwargs)
    finally:
        _current.clear()


def prepare_dataframe(df: Any, path: str, num_processes: int, columns: Optional[Sequence[str]] = None
                      ) -> Tuple[Dict[str, ColumnInfo], int]:
    """Check `columns` (default: all) of `df` and write them to `path` for `num_processes` ranks."""
    columns = list(columns) if columns is not None else list(df.columns)
    infos, rows = inspect_columns(df, columns)
    if rows < num_processes:
        raise LaunchValidationError(
            f"The DataFrame has {rows} row(s), fewer than num_processes={num_processes}: every "
            "rank needs at least one row. Use fewer processes or more data."
        )
    write_parquet(select_for_parquet(df, infos), path, num_processes, infos)
    return infos, rows
