"""distributor.shards: rank shards of a Parquet dataset (pyarrow only, no Spark)."""
from __future__ import annotations

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="the data path needs pyarrow: pip install horovod-compat[spark]")
import pyarrow.parquet as pq  # noqa: E402

from distributor.shards import (  # noqa: E402
    ShardReader,
    batch_sizes,
    list_parquet_files,
    open_shard,
    parquet_columns,
    plan_shards,
    row_groups,
    steps_per_epoch,
)


def write_dataset(folder, rows=1003, files=3, row_group=50, width=4):
    folder.mkdir()
    ids = np.arange(rows)
    for f, chunk in enumerate(np.array_split(ids, files)):
        table = pa.table({
            "id": pa.array(chunk, pa.int64()),
            "x": pa.array([np.full(width, i, np.float32) for i in chunk], pa.list_(pa.float32())),
        })
        pq.write_table(table, folder / f"part-{f:05d}.parquet", row_group_size=row_group)
    (folder / "_SUCCESS").write_text("")
    return str(folder)


def test_plan_shards_cuts_equal_contiguous_ranges():
    groups = [("a", 0, 7), ("a", 1, 3), ("b", 0, 11)]
    shards = plan_shards(groups, 4)
    sizes = [sum(p.num_rows for p in s) for s in shards]
    assert sum(sizes) == 21 and max(sizes) - min(sizes) <= 1
    covered = [(p.path, p.row_group, r) for s in shards for p in s for r in range(p.start, p.stop)]
    assert len(covered) == len(set(covered)) == 21


@pytest.mark.parametrize("rows,steps,batch", [(97, 4, 32), (96, 4, 32), (3, 4, 1), (10, 1, 10)])
def test_batch_sizes_sum_to_the_rows(rows, steps, batch):
    sizes = batch_sizes(rows, steps, batch)
    assert len(sizes) == steps and sum(sizes) == rows and max(sizes) <= batch
    assert sizes == sorted(sizes, reverse=True)


def test_every_rank_takes_the_same_steps_and_sees_each_row_once_per_epoch(tmp_path):
    path = write_dataset(tmp_path / "data")
    world = 3
    readers = [open_shard(path, r, world, ["id", "x"], batch_size=16, shuffle=True, seed=5,
                          buffer_row_groups=2) for r in range(world)]
    assert len({r.steps for r in readers}) == 1
    orders = []
    for epoch in range(2):
        seen = []
        for reader in readers:
            batches = list(reader.batches(epoch))
            assert len(batches) == reader.steps
            for batch in batches:
                assert batch["x"].shape == (len(batch["id"]), 4)
                assert (batch["x"][:, 0] == batch["id"]).all()  # rows stay whole
                seen.extend(batch["id"].tolist())
        assert sorted(seen) == list(range(1003))  # no repeat, no drop
        orders.append(seen)
    assert orders[0] != orders[1], "the shuffle did not change between epochs"


def test_without_shuffle_rows_come_in_order(tmp_path):
    path = write_dataset(tmp_path / "data", rows=100, files=2, row_group=7)
    reader = open_shard(path, 1, 2, ["id"], batch_size=8, shuffle=False)
    ids = np.concatenate([b["id"] for b in reader.batches(0)])
    assert ids.tolist() == list(range(50, 100))


def test_reading_is_streamed_a_window_at_a_time(tmp_path):
    path = write_dataset(tmp_path / "data", rows=2000, files=2, row_group=20)
    files = list_parquet_files(path)
    shard = plan_shards(row_groups(files), 1)[0]
    reader = ShardReader(shard, ["id"], batch_size=10, steps=200, shuffle=True, buffer_row_groups=3)
    reads = []
    original = reader._read
    reader._read = lambda piece: reads.append(piece) or original(piece)
    batches = reader.batches(0)
    next(batches)
    assert len(reads) == 3  # one shuffle window of 3 row groups, not the 100 of the shard
    assert sum(len(b["id"]) for b in batches) == 1990


def test_parquet_columns_describes_arrays_and_reports_missing_ones(tmp_path):
    path = write_dataset(tmp_path / "data", rows=10, files=1)
    info = parquet_columns(path, ["id", "x"])
    assert (info["id"].kind, info["id"].size) == ("scalar", 1)
    assert (info["x"].kind, info["x"].size, info["x"].dtype) == ("array", 4, "float32")
    with pytest.raises(ValueError, match="no column.*'nope'"):
        parquet_columns(path, ["nope"])


def test_steps_cover_the_largest_shard():
    assert steps_per_epoch([10, 11, 11], 4) == 3
    assert steps_per_epoch([1, 1], 32) == 1
