"""``horovod.spark.common.datamodule``: the base of a `data_module=` for `TorchEstimator`.

Each rank builds the estimator's `data_module` class with keyword arguments (`data_module_kwargs`
lists them: Horovod's names, such as `train_dir`, `cur_shard`, `shard_count`,
`train_batch_size`, `steps_per_epoch_train`, plus `feature_cols`, `label_cols`, `schema_fields`
and `filesystem`), enters it as a context manager and takes `steps_per_epoch_train` batches per
epoch from one iterator over `train_data()` (and `steps_per_epoch_val` from `val_data()`), so the
iterables must last for all the epochs. A batch is a dict of tensors or numpy arrays by column,
or a `(features dict, label tensor)` pair. Without `data_module`, the estimator streams its own
Parquet shards (`distributor.shards`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional


class DataModule(ABC):
    """Context manager base class of data modules; subclasses implement train_data/val_data."""

    short_name: Optional[str] = None

    def __init__(self, train_dir: str, val_dir: str, num_train_epochs: int = 1, has_val: bool = True,
                 train_batch_size: int = 32, val_batch_size: int = 32, shuffle: bool = True,
                 transform_fn: Any = None, inmemory_cache_all: bool = False, cur_shard: int = 0,
                 shard_count: int = 1, schema_fields: Any = None, storage_options: Any = None,
                 steps_per_epoch_train: int = 1, steps_per_epoch_val: int = 1, verbose: Any = True,
                 **kwargs: Any) -> None:
        super().__init__()
        self.train_dir, self.val_dir = train_dir, val_dir
        self.num_train_epochs, self.has_val = num_train_epochs, has_val
        self.train_batch_size, self.val_batch_size = train_batch_size, val_batch_size
        self.shuffle, self.transform_fn, self.inmemory_cache_all = shuffle, transform_fn, inmemory_cache_all
        self.cur_shard, self.shard_count = cur_shard, shard_count
        self.schema_fields, self.storage_options = schema_fields, storage_options
        self.steps_per_epoch_train, self.steps_per_epoch_val = steps_per_epoch_train, steps_per_epoch_val
        self.verbose = verbose

    def __enter__(self) -> "DataModule":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    @abstractmethod
    def train_data(self) -> Any:
        """The training batches, for all the epochs."""

    @abstractmethod
    def val_data(self) -> Any:
        """The validation batches, for all the epochs."""
