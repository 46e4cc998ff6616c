"""``horovod.spark.common.store``: where the estimators keep their data and runs.

Horovod's layout under a store's prefix path::

    <prefix>/intermediate_train_data.<idx>/   the training rows, as Parquet
    <prefix>/intermediate_val_data.<idx>/     the validation rows
    <prefix>/runs/<run_id>/<checkpoint file>  the run's checkpoint (torch: a plain state dict)
    <prefix>/runs/<run_id>/logs/              the run's logs

`FilesystemStore` works on any fsspec filesystem: local paths and ``file://`` always, ``s3://``,
``gs://``, ``abfs://`` ... when their fsspec package (s3fs, gcsfs, adlfs) is installed.
`HDFSStore` goes through pyarrow's HadoopFileSystem (which needs libhdfs and a Hadoop client).
Any store that cannot be used raises `StoreError` saying what is missing.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import posixpath
import re
import tempfile
import uuid
from typing import Any, Dict, List, Optional

#: The fsspec package each well-known protocol needs.
_PROTOCOL_PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "abfss": "adlfs",
    "az": "adlfs", "adl": "adlfs", "hdfs": "pyarrow", "webhdfs": "fsspec",
}


class StoreError(ValueError):
    """A store path that cannot be used (missing package, unreachable or read-only path)."""


def is_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def _split_protocol(path: str):
    from fsspec.core import split_protocol

    return split_protocol(path)


class Store:
    """Storage for the estimators' intermediate data (Parquet) and training runs (checkpoints)."""

    def __init__(self) -> None:
        self._train_data_to_key: Dict[Any, Any] = {}
        self._val_data_to_key: Dict[Any, Any] = {}

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> "Store":
        """The store for `prefix_path`: HDFS for ``hdfs://``, DBFS on Databricks for DBFS paths,
        an fsspec filesystem otherwise."""
        if HDFSStore.matches(prefix_path):
            return HDFSStore(prefix_path, *args, **kwargs)
        if is_databricks() and DBFSLocalStore.matches_dbfs(prefix_path):
            return DBFSLocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)

    # The interface; AbstractFilesystemStore implements it.
    def get_train_data_path(self, idx: Any = None) -> str:
        raise NotImplementedError()

    def get_val_data_path(self, idx: Any = None) -> str:
        raise NotImplementedError()

    def get_test_data_path(self, idx: Any = None) -> str:
        raise NotImplementedError()

    def saving_runs(self) -> bool:
        raise NotImplementedError()

    def get_runs_path(self) -> str:
        raise NotImplementedError()

    def get_run_path(self, run_id: str) -> str:
        raise NotImplementedError()

    def get_checkpoint_path(self, run_id: str) -> Optional[str]:
        raise NotImplementedError()

    def get_logs_path(self, run_id: str) -> Optional[str]:
        raise NotImplementedError()

    def get_checkpoint_filename(self) -> str:
        raise NotImplementedError()

    def get_logs_subdir(self) -> str:
        raise NotImplementedError()

    def exists(self, path: str) -> bool:
        raise NotImplementedError()

    def read(self, path: str) -> bytes:
        raise NotImplementedError()

    def write_text(self, path: str, text: str) -> None:
        raise NotImplementedError()

    def to_remote(self, run_id: str, dataset_idx: Any = None) -> Any:
        """A plain object with the store's paths for this run, as Horovod's remote code reads them."""
        attrs = {
            "train_data_path": self.get_train_data_path(dataset_idx),
            "val_data_path": self.get_val_data_path(dataset_idx),
            "test_data_path": self.get_test_data_path(dataset_idx),
            "saving_runs": self.saving_runs(),
            "runs_path": self.get_runs_path(),
            "run_path": self.get_run_path(run_id),
            "checkpoint_path": self.get_checkpoint_path(run_id),
            "logs_path": self.get_logs_path(run_id),
            "checkpoint_filename": self.get_checkpoint_filename(),
            "logs_subdir": self.get_logs_subdir(),
        }
        return type("RemoteStore", (), attrs)()


class AbstractFilesystemStore(Store):
    """A store on a filesystem (`fs`, fsspec's interface) under `prefix_path`."""

    def __init__(self, prefix_path: str, train_path: Optional[str] = None,
                 val_path: Optional[str] = None, test_path: Optional[str] = None,
                 runs_path: Optional[str] = None, save_runs: bool = True,
                 storage_options: Optional[dict] = None, checkpoint_filename: Optional[str] = None,
                 **kwargs: Any) -> None:
        self.prefix_path = self.get_full_path(prefix_path)
        self._train_path = self._full_or_default(train_path, "intermediate_train_data")
        self._val_path = self._full_or_default(val_path, "intermediate_val_data")
        self._test_path = self._full_or_default(test_path, "intermediate_test_data")
        self._runs_path = self._full_or_default(runs_path, "runs")
        self._save_runs = save_runs
        self.storage_options = storage_options
        self.checkpoint_filename = checkpoint_filename or "checkpoint"
        super().__init__()

    def _full_or_default(self, path: Optional[str], key: str) -> str:
        return self.get_full_path(path) if path is not None else posixpath.join(self.prefix_path, key)

    # ---- paths -------------------------------------------------------------------------------
    def get_train_data_path(self, idx: Any = None) -> str:
        return f"{self._train_path}.{idx}" if idx is not None else self._train_path

    def get_val_data_path(self, idx: Any = None) -> str:
        return f"{self._val_path}.{idx}" if idx is not None else self._val_path

    def get_test_data_path(self, idx: Any = None) -> str:
        return f"{self._test_path}.{idx}" if idx is not None else self._test_path

    def saving_runs(self) -> bool:
        return self._save_runs

    def get_runs_path(self) -> str:
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        return posixpath.join(self.get_runs_path(), run_id)

    def get_checkpoint_path(self, run_id: str) -> Optional[str]:
        return self.get_run_path(run_id) if self._save_runs else None

    def get_checkpoint_file(self, run_id: str) -> Optional[str]:
        """The run's checkpoint file: `<runs>/<run_id>/<checkpoint_filename>`."""
        folder = self.get_checkpoint_path(run_id)
        return posixpath.join(folder, self.get_checkpoint_filename()) if folder else None

    def get_checkpoints(self, run_id: str, suffix: str = ".ckpt") -> List[str]:
        folder = self.get_localized_path(self.get_checkpoint_path(run_id) or "")
        if not folder or not self.fs.exists(folder):
            return []
        return sorted(name for name in self.fs.ls(folder, detail=False) if name.endswith(suffix))

    def get_logs_path(self, run_id: str) -> Optional[str]:
        return posixpath.join(self.get_run_path(run_id), self.get_logs_subdir()) if self._save_runs else None

    def get_checkpoint_filename(self) -> str:
        return self.checkpoint_filename

    def get_logs_subdir(self) -> str:
        return "logs"

    # ---- I/O ---------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.exists(self.get_localized_path(path))

    def read(self, path: str) -> bytes:
        with self.fs.open(self.get_localized_path(path), "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        """Write `data` to `path` whole: to a temporary name first, then renamed into place."""
        local = self.get_localized_path(path)
        self.fs.makedirs(posixpath.dirname(local), exist_ok=True)
        partial = f"{local}.{uuid.uuid4().hex[:8]}.partial"
        with self.fs.open(partial, "wb") as f:
            f.write(data)
        self.fs.mv(partial, local)

    def write_text(self, path: str, text: str) -> None:
        self.write(path, text.encode("utf-8"))

    def delete(self, path: str) -> None:
        local = self.get_localized_path(path)
        if self.fs.exists(local):
            self.fs.rm(local, recursive=True)

    def move(self, source: str, target: str) -> None:
        self.delete(target)
        self.fs.mv(self.get_localized_path(source), self.get_localized_path(target), recursive=True)

    def is_parquet_dataset(self, path: str) -> bool:
        try:
            return self.get_parquet_dataset(path) is not None
        except Exception:  # noqa: BLE001 - any failure means "not a readable dataset"
            return False

    def get_parquet_dataset(self, path: str) -> Any:
        import pyarrow.parquet as pq

        return pq.ParquetDataset(self.get_localized_path(path), filesystem=self.arrow_filesystem())

    def arrow_filesystem(self) -> Any:
        """The store's filesystem for pyarrow (None means the local one)."""
        return self.fs

    def check_writable(self) -> None:
        """Write and remove a small file under the prefix path; `StoreError` if that fails."""
        probe = posixpath.join(self.prefix_path, f".horovod-compat-probe-{uuid.uuid4().hex[:8]}")
        try:
            self.write(probe, b"ok")
            self.delete(probe)
        except Exception as exc:  # noqa: BLE001 - reported with the path
            raise StoreError(
                f"The store cannot write under {self.prefix_path!r} ({type(exc).__name__}: {exc}). "
                "Give Store.create() a directory that exists or can be created, is writable, and "
                "is reachable from the driver and every executor."
            ) from exc

    def get_local_output_dir_fn(self, run_id: str) -> Any:
        @contextlib.contextmanager
        def local_run_path():
            with tempfile.TemporaryDirectory() as folder:
                yield folder
        return local_run_path

    def sync_fn(self, run_id: str) -> Any:
        """A function copying a local directory's files into the run's directory."""
        run_path = self.get_localized_path(self.get_run_path(run_id))
        fs = self.fs

        def sync(local_dir: str) -> None:
            for root, _, files in os.walk(local_dir):
                for name in files:
                    source = os.path.join(root, name)
                    relative = os.path.relpath(source, local_dir).replace(os.sep, "/")
                    target = posixpath.join(run_path, relative)
                    fs.makedirs(posixpath.dirname(target), exist_ok=True)
                    fs.put_file(source, target)
        return sync

    def get_localized_path(self, path: str) -> str:
        raise NotImplementedError()

    def get_full_path(self, path: str) -> str:
        raise NotImplementedError()

    def get_full_path_fn(self) -> Any:
        raise NotImplementedError()

    @property
    def fs(self) -> Any:
        raise NotImplementedError()


class FilesystemStore(AbstractFilesystemStore):
    """A store on the fsspec filesystem of `prefix_path`'s protocol (local when it has none).

    `storage_options` go to the filesystem's constructor (e.g. credentials for s3fs).
    """

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        self.storage_options = kwargs.get("storage_options") or {}
        self._fs, self.protocol = _fsspec_filesystem(prefix_path, self.storage_options)
        known = ("train_path", "val_path", "test_path", "runs_path", "save_runs",
                 "storage_options", "checkpoint_filename")
        super().__init__(prefix_path, *args, **{k: v for k, v in kwargs.items() if k in known})

    @property
    def fs(self) -> Any:
        return self._fs

    def get_filesystem(self) -> Any:
        return self._fs

    def get_localized_path(self, path: str) -> str:
        protocol, local = _split_protocol(path)
        return local if protocol not in (None, "file", "local") else _local_path(path)

    def get_full_path(self, path: str) -> str:
        return self.get_full_path_fn()(path)

    def get_full_path_fn(self) -> Any:
        def full_path(path: str) -> str:
            protocol, _ = _split_protocol(path)
            if protocol is not None:
                return path
            return pathlib.Path(os.path.abspath(path)).as_uri()
        return full_path

    def arrow_filesystem(self) -> Any:
        return None if self.protocol in (None, "file", "local") else self._fs

    @classmethod
    def matches(cls, path: str) -> bool:
        return True


def _local_path(path: str) -> str:
    """A local path from a path or a ``file:`` URI."""
    if path.startswith("file://"):
        return path[len("file://"):] or "/"
    if path.startswith("file:"):
        return path[len("file:"):]
    return path


def _fsspec_filesystem(path: str, storage_options: dict):
    """The fsspec filesystem for `path`'s protocol; `StoreError` naming the package it lacks."""
    import fsspec
    from fsspec.utils import update_storage_options

    protocol, _ = _split_protocol(path)
    try:
        cls = fsspec.get_filesystem_class(protocol or "file")
    except (ImportError, ValueError) as exc:
        package = _PROTOCOL_PACKAGES.get(protocol or "", f"the fsspec implementation for {protocol}://")
        raise StoreError(
            f"Store path {path!r} uses the {protocol}:// filesystem, which needs {package} "
            f"({exc}). Install it in the driver's and the executors' Python (pip install "
            f"{package}), or use a local or file:// path."
        ) from None
    options = cls._get_kwargs_from_urls(path)
    update_storage_options(options, dict(storage_options))
    return cls(**options), protocol


class LocalStore(FilesystemStore):
    """A store on the local filesystem (Horovod keeps the name; it is a `FilesystemStore`)."""


class HDFSStore(AbstractFilesystemStore):
    """A store on HDFS through pyarrow's HadoopFileSystem.

    `prefix_path` is ``hdfs://namenode:8020/path``, ``hdfs:///path`` or ``/path``; `host` and
    `port` default to those in the URL, else to "default" and 0 (the Hadoop configuration's).
    """

    FS_PREFIX = "hdfs://"
    URL_PATTERN = r"^(?:(.+://))?(?:([^/:]+))?(?:[:]([0-9]+))?(?:(.+))?$"

    def __init__(self, prefix_path: str, host: Optional[str] = None, port: Optional[int] = None,
                 user: Optional[str] = None, kerb_ticket: Optional[str] = None,
                 driver: str = "libhdfs", extra_conf: Optional[dict] = None,
                 *args: Any, **kwargs: Any) -> None:
        prefix, url_host, url_port, path, offset = self.parse_url(prefix_path)
        if prefix is not None and prefix != self.FS_PREFIX:
            raise StoreError(f"HDFSStore needs an hdfs:// path, got {prefix_path!r}.")
        if not path:
            raise StoreError(f"No path in the HDFS URL {prefix_path!r}; add one, e.g. hdfs:///user/me/horovod.")
        self._url_prefix = prefix_path[:offset] if prefix else self.FS_PREFIX
        self._hdfs_kwargs = dict(host=host or url_host or "default", port=int(port or url_port or 0),
                                 user=user, kerb_ticket=kerb_ticket, extra_conf=extra_conf)
        self._hdfs = _connect_hdfs(self._hdfs_kwargs)
        super().__init__(prefix_path, *args, **kwargs)

    def parse_url(self, url: str):
        match = re.search(self.URL_PATTERN, url)
        port = match.group(3)
        return match.group(1), match.group(2), int(port) if port else None, match.group(4), match.start(4)

    def get_full_path(self, path: str) -> str:
        return path if self.matches(path) else self._url_prefix + path

    def get_full_path_fn(self) -> Any:
        prefix = self._url_prefix
        return lambda path: prefix + path

    def get_localized_path(self, path: str) -> str:
        return path[len(self._url_prefix):] if path.startswith(self._url_prefix) else path

    @property
    def fs(self) -> Any:
        return self._hdfs

    def arrow_filesystem(self) -> Any:
        return self._hdfs

    @classmethod
    def matches(cls, path: str) -> bool:
        return path.startswith(cls.FS_PREFIX)


def _connect_hdfs(kwargs: dict) -> Any:
    """pyarrow's HadoopFileSystem behind fsspec's interface; `StoreError` when it cannot connect."""
    try:
        from fsspec.implementations.arrow import ArrowFSWrapper
        from pyarrow.fs import HadoopFileSystem
    except ImportError as exc:
        raise StoreError(f"HDFSStore needs pyarrow with HDFS support and fsspec ({exc}); "
                         "pip install pyarrow fsspec.") from None
    try:
        return ArrowFSWrapper(HadoopFileSystem(**kwargs))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError/ImportError variants
        raise StoreError(
            f"HDFSStore could not connect to HDFS at {kwargs['host']}:{kwargs['port']} through "
            f"pyarrow ({type(exc).__name__}: {exc}). pyarrow needs a Hadoop client: libhdfs.so "
            "(ARROW_LIBHDFS_DIR or HADOOP_HOME), JAVA_HOME and the Hadoop CLASSPATH "
            "(`hadoop classpath --glob`), and a reachable namenode."
        ) from None


# Where DBFSLocalStore maps /dbfs/... in tests (None: the real /dbfs mount).
_DBFS_PREFIX_MAPPING: Optional[str] = None


class DBFSLocalStore(FilesystemStore):
    """A store on Databricks' DBFS through its local mount (``/dbfs/...``).

    Accepts ``/dbfs/...``, ``dbfs:/...``, ``file:/dbfs/...`` and ``file:///dbfs/...``.
    """

    DBFS_PATH_FORMAT_ERROR = ("The provided path is not a DBFS path: {}, Please provide a path "
                              "starting with `/dbfs/...` or `dbfs:/...` or `file:/dbfs/...` or "
                              "`file:///dbfs/...`.")

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(self.normalize_path(prefix_path), *args, **kwargs)

    @classmethod
    def matches_dbfs(cls, path: str) -> bool:
        return (path.startswith("dbfs:/") and not path.startswith("dbfs://")) or \
            path.startswith(("/dbfs/", "file:///dbfs/", "file:/dbfs/"))

    @staticmethod
    def normalize_path(path: str) -> str:
        """The ``/dbfs/...`` form of a DBFS path."""
        if path.startswith("dbfs:/") and not path.startswith("dbfs://"):
            return "/dbfs" + path[len("dbfs:"):]
        if path.startswith("/dbfs/"):
            return path
        if path.startswith("file:///dbfs/"):
            return path[len("file://"):]
        if path.startswith("file:/dbfs/"):
            return path[len("file:"):]
        raise ValueError(DBFSLocalStore.DBFS_PATH_FORMAT_ERROR.format(path))

    def get_localized_path(self, path: str) -> str:
        local = self.normalize_path(path)
        if _DBFS_PREFIX_MAPPING:
            return os.path.join(_DBFS_PREFIX_MAPPING, local[len("/dbfs/"):])
        return local

    def get_full_path(self, path: str) -> str:
        return "file://" + self.normalize_path(path)

    def get_full_path_fn(self) -> Any:
        return self.get_full_path
