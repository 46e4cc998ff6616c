"""Each rank's share of a Parquet dataset, streamed with pyarrow in bounded memory.

The dataset's rows, in file and row-group order, are cut into `world_size` contiguous ranges
whose sizes differ by at most one row (`plan_shards`); a rank reads only the row groups its
range overlaps. Every rank takes the same number of steps per epoch (`steps_per_epoch`): the
steps are cut from the largest shard, and a smaller shard ends with a smaller (possibly empty)
batch, so no rank waits for another in a collective and no row is repeated or dropped.

A shuffled epoch reads the rank's row groups in a new random order and permutes the rows inside
a window of `buffer_row_groups` row groups: memory stays bounded by that window whatever the
dataset's size, and every row of the shard appears exactly once per epoch.

This module knows nothing of Spark: it needs pyarrow and numpy (and fsspec for remote stores).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np


#: Numpy arrays of one batch, by column name.
Batch = Dict[str, np.ndarray]
SCALAR, ARRAY, VECTOR = "scalar", "array", "vector"


@dataclass(frozen=True)


class ColumnInfo:
    """How a column reaches the ranks: `kind` (scalar, array or vector), values per row, dtype."""

    name: str
    kind: str
    size: int
    dtype: str
    spark_type: str = ""


def parquet_columns(path: str, columns: Sequence[str], filesystem: Any = None) -> Dict[str, ColumnInfo]:
    """Describe `columns` of the Parquet dataset at `path` from its schema and first row.

    Raises ValueError naming the missing columns.
    """
    import pyarrow as pa

    files = list_parquet_files(path, filesystem)
    if not files:
        raise ValueError(f"No Parquet files under {path!r}.")
    handle = _open(files[0], filesystem)
    schema = handle.schema_arrow
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(f"The Parquet data at {path!r} has no column(s) {missing}; it has {schema.names}.")
    first = handle.read_row_group(0, columns=list(columns)).slice(0, 1) if handle.num_row_groups else None
    infos = {}
    for name in columns:
        arrow_type = schema.field(name).type
        if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
            size = len(first.column(name)[0].values) if first is not None and first.num_rows else 0
            infos[name] = ColumnInfo(name, ARRAY, size, arrow_type.value_type.to_pandas_dtype().__name__)
        else:
            infos[name] = ColumnInfo(name, SCALAR, 1, arrow_type.to_pandas_dtype().__name__)
    return infos


@dataclass(frozen=True)


class Piece:
    """Rows [start, stop) of row group `row_group` of the Parquet file `path`."""

    path: str
    row_group: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def _open(path: str, filesystem: Any):
    import pyarrow.parquet as pq

    if filesystem is None:
        return pq.ParquetFile(path)
    return pq.ParquetFile(filesystem.open(path, "rb"))


def list_parquet_files(path: str, filesystem: Any = None) -> List[str]:
    """The data files of a Parquet dataset directory (Spark's output), sorted; or `[path]`."""
    import os

    def is_data(name: str) -> bool:
        base = name.rstrip("/").rsplit("/", 1)[-1]
        return not base.startswith(("_", ".")) and (base.endswith(".parquet") or ".parquet" in base
                                                    or base.startswith("part-"))

    if filesystem is None:
        if os.path.isfile(path):
            return [path]
        if not os.path.isdir(path):
            raise FileNotFoundError(f"No Parquet data at {path!r}.")
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            found.extend(os.path.join(root, f) for f in sorted(files) if is_data(f))
        return sorted(found)
    if filesystem.isfile(path):
        return [path]
    return sorted(p for p in filesystem.find(path) if is_data(p) and "/_" not in p[len(path):])


def row_groups(paths: Sequence[str], filesystem: Any = None) -> List[Tuple[str, int, int]]:
    """(path, row group index, rows) of every non-empty row group, in file order."""
    found = []
    for path in paths:
        meta = _open(path, filesystem).metadata
        for index in range(meta.num_row_groups):
            rows = meta.row_group(index).num_rows
            if rows:
                found.append((path, index, rows))
    return found


def plan_shards(groups: Sequence[Tuple[str, int, int]], world_size: int) -> List[List[Piece]]:
    """Cut the rows of `groups` into `world_size` contiguous shards of equal size (within one)."""
    total = sum(rows for _, _, rows in groups)
    bounds = [total * r // world_size for r in range(world_size + 1)]
    shards: List[List[Piece]] = [[] for _ in range(world_size)]
    offset = 0
    for path, index, rows in groups:
        for rank in range(world_size):
            lo, hi = max(bounds[rank], offset), min(bounds[rank + 1], offset + rows)
            if lo < hi:
                shards[rank].append(Piece(path, index, lo - offset, hi - offset))
        offset += rows
    return shards


def steps_per_epoch(shard_rows: Sequence[int], batch_size: int) -> int:
    """Steps every rank takes in an epoch: enough for the largest shard."""
    return max(math.ceil(max(shard_rows) / batch_size), 1) if shard_rows else 0


def batch_sizes(rows: int, steps: int, batch_size: int) -> List[int]:
    """`steps` batch sizes summing to `rows`: full batches first, the shortfall taken from the
    last ones (each keeps at least one row while there are rows to spare)."""
    if rows > steps * batch_size:
        raise ValueError(f"{rows} rows do not fit in {steps} steps of {batch_size}")
    sizes = [batch_size] * steps
    excess = steps * batch_size - rows
    for floor in (1, 0):
        for i in reversed(range(steps)):
            cut = min(excess, sizes[i] - floor)
            if cut > 0:
                sizes[i] -= cut
                excess -= cut
    return sizes


def column_to_numpy(column: Any) -> np.ndarray:
    """A pyarrow column as numpy: scalars as 1-D, fixed-size lists (arrays, vectors) as 2-D."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
            pa.types.is_fixed_size_list(column.type):
        values = column.flatten().to_numpy(zero_copy_only=False)
        rows = len(column)
        if rows == 0:
            return values.reshape(0, 0)
        if values.size % rows:
            raise ValueError(
                f"array column of {rows} rows holds {values.size} values: its rows have different "
                "lengths; every row of an array or vector column must have the same length"
            )
        return values.reshape(rows, values.size // rows)
    return column.to_numpy(zero_copy_only=False)


class ShardReader:
    """Batches of one rank's shard, epoch after epoch.

    `pieces` is the rank's shard (from `plan_shards`), `steps` the steps every rank takes (from
    `steps_per_epoch`). `batches(epoch)` yields `steps` batches, each a dict of numpy arrays by
    column (or a pyarrow Table with `as_arrow=True`).
    """

    def __init__(
        self,
        pieces: Sequence[Piece],
        columns: Sequence[str],
        batch_size: int,
        steps: int,
        shuffle: bool = True,
        seed: int = 0,
        buffer_row_groups: int = 4,
        filesystem: Any = None,
    ) -> None:
        self.pieces = list(pieces)
        self.columns = list(columns)
        self.batch_size = batch_size
        self.steps = steps
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_row_groups = max(1, buffer_row_groups)
        self.filesystem = filesystem
        self.num_rows = sum(p.num_rows for p in self.pieces)
        self._files: Dict[str, Any] = {}

    def _read(self, piece: Piece):
        handle = self._files.get(piece.path)
        if handle is None:
            handle = self._files[piece.path] = _open(piece.path, self.filesystem)
        table = handle.read_row_group(piece.row_group, columns=self.columns)
        return table.slice(piece.start, piece.num_rows)

    def _empty(self):

        if not self.pieces:
            raise ValueError("this rank's shard is empty: the dataset has fewer rows than ranks")
        schema = _open(self.pieces[0].path, self.filesystem).schema_arrow
        return schema.empty_table().select(self.columns)

    def _blocks(self, rng: Optional[np.random.Generator]) -> Iterator[Batch]:
        """The shard's rows as numpy blocks: row groups in order, or windows of
        `buffer_row_groups` row groups in a random order with their rows permuted."""
        if rng is None:
            for piece in self.pieces:
                yield to_numpy(self._read(piece), self.columns)
            return
        order = rng.permutation(len(self.pieces))
        for at in range(0, len(order), self.buffer_row_groups):
            parts = [to_numpy(self._read(self.pieces[i]), self.columns)
                     for i in order[at:at + self.buffer_row_groups]]
            rows = sum(len(next(iter(p.values()))) for p in parts) if self.columns else 0
            places = rng.permutation(rows)  # where each row of the window goes
            window = {}
            for name in self.columns:
                first = parts[0][name]
                out = np.empty((rows,) + first.shape[1:], dtype=first.dtype)
                at = 0
                for part in parts:  # one scattered copy, no concatenated one
                    n = len(part[name])
                    out[places[at:at + n]] = part[name]
                    at += n
                window[name] = out
            del parts  # the row groups are not held while `window` is consumed
            yield window

    def batches(self, epoch: int = 0) -> Iterator[Batch]:
        """The epoch's `steps` batches, each a dict of numpy arrays by column (rows first)."""
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        blocks = self._blocks(rng)
        block: Batch = {}
        offset = available = 0
        for size in batch_sizes(self.num_rows, self.steps, self.batch_size):
            parts = []
            needed = size
            while needed:
                if available == 0:
                    block = next(blocks)
                    offset, available = 0, len(next(iter(block.values())))
                    continue
                take = min(needed, available)
                parts.append({k: v[offset:offset + take] for k, v in block.items()})
                offset, available, needed = offset + take, available - take, needed - take
            if not parts:  # an empty last step of a shard smaller than the others
                yield to_numpy(self._empty(), self.columns)
            elif len(parts) == 1:
                yield parts[0]
            else:
                yield {k: np.concatenate([p[k] for p in parts]) for k in self.columns}

    def __iter__(self) -> Iterator[Any]:
        return self.batches(0)


def to_numpy(table: Any, columns: Sequence[str]) -> Batch:
    """A pyarrow table's columns as numpy arrays (see `column_to_numpy`)."""
    return {name: column_to_numpy(table.column(name)) for name in columns}


def open_shard(
    path: str,
    rank: int,
    world_size: int,
    columns: Sequence[str],
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    buffer_row_groups: int = 4,
    filesystem: Any = None,
) -> ShardReader:
    """The `ShardReader` of `rank` over the Parquet dataset at `path`."""
    groups = row_groups(list_parquet_files(path, filesystem), filesystem)
    shards = plan_shards(groups, world_size)
    steps = steps_per_epoch([sum(p.num_rows for p in s) for s in shards], batch_size)
    return ShardReader(shards[rank], columns, batch_size, steps, shuffle, seed,
                       buffer_row_groups, filesystem)
