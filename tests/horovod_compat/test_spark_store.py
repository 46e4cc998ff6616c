"""horovod.spark.common.store: Horovod's layout and constructor arguments, and clear errors for
stores that cannot be used (no Spark needed)."""
from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("fsspec", reason="the stores need fsspec: pip install horovod-compat[spark]")

from horovod.spark.common import store as store_module  # noqa: E402
from horovod.spark.common.store import (  # noqa: E402
    DBFSLocalStore,
    FilesystemStore,
    HDFSStore,
    LocalStore,
    Store,
    StoreError,
)


def test_layout_under_the_prefix(tmp_path):
    store = Store.create(str(tmp_path))
    prefix = tmp_path.as_uri()
    assert type(store) is FilesystemStore and store.prefix_path == prefix
    assert store.get_train_data_path() == f"{prefix}/intermediate_train_data"
    assert store.get_val_data_path(3) == f"{prefix}/intermediate_val_data.3"
    assert store.get_test_data_path() == f"{prefix}/intermediate_test_data"
    assert store.get_run_path("r1") == f"{prefix}/runs/r1"
    assert store.get_checkpoint_path("r1") == f"{prefix}/runs/r1"
    assert store.get_checkpoint_file("r1") == f"{prefix}/runs/r1/checkpoint"
    assert store.get_logs_path("r1") == f"{prefix}/runs/r1/logs"
    remote = store.to_remote("r1", 3)
    assert remote.train_data_path == f"{prefix}/intermediate_train_data.3"
    assert remote.checkpoint_filename == "checkpoint"


def test_constructor_arguments_and_io(tmp_path):
    store = LocalStore(f"file://{tmp_path}", train_path=str(tmp_path / "t"), runs_path=str(tmp_path / "r"),
                       save_runs=True, checkpoint_filename="ckpt.pt")
    assert store.get_train_data_path() == (tmp_path / "t").as_uri()
    assert store.get_checkpoint_file("x") == f"{(tmp_path / 'r').as_uri()}/x/ckpt.pt"
    path = store.get_checkpoint_file("x")
    assert not store.exists(path)
    store.write(path, b"state")
    assert store.exists(path) and store.read(path) == b"state"
    assert (tmp_path / "r" / "x" / "ckpt.pt").read_bytes() == b"state"
    assert not list((tmp_path / "r" / "x").glob("*.partial"))
    assert FilesystemStore(str(tmp_path), save_runs=False).get_checkpoint_path("x") is None


def test_unwritable_prefix_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match=r"cannot write under .*file/sub"):
        Store.create(str(blocker / "sub")).check_writable()


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs is installed here")
def test_a_cloud_store_without_its_package_names_the_package():
    with pytest.raises(StoreError, match=r"s3:// filesystem, which needs s3fs.*pip install s3fs"):
        Store.create("s3://bucket/horovod")


def test_hdfs_store_parses_urls_and_explains_a_failed_connection():
    with pytest.raises(StoreError, match=r"could not connect to HDFS at namenode:8020 through pyarrow"):
        Store.create("hdfs://namenode:8020/user/me/horovod")
    with pytest.raises(StoreError, match="needs an hdfs:// path"):
        HDFSStore("s3://bucket/x")


def test_dbfs_paths(tmp_path, monkeypatch):
    for path in ("dbfs:/ml/run", "/dbfs/ml/run", "file:/dbfs/ml/run", "file:///dbfs/ml/run"):
        assert DBFSLocalStore.normalize_path(path) == "/dbfs/ml/run"
        assert DBFSLocalStore.matches_dbfs(path)
    assert not DBFSLocalStore.matches_dbfs("dbfs://host/ml")
    with pytest.raises(ValueError, match="not a DBFS path"):
        DBFSLocalStore.normalize_path("/tmp/x")
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "14.3")
    monkeypatch.setattr(store_module, "_DBFS_PREFIX_MAPPING", str(tmp_path))
    store = Store.create("dbfs:/ml/run")
    assert type(store) is DBFSLocalStore
    assert store.get_full_path("/dbfs/ml/run") == "file:///dbfs/ml/run"
    assert store.get_localized_path("/dbfs/ml/run/runs/a") == str(tmp_path / "ml/run/runs/a")
