"""``PreparedData``: where an estimator's `fit` wrote the rows, and what their columns hold.

The driver makes it (`estimator.py`) and every rank unpickles it with its training config, so it
lives apart from the estimator: a rank that reads its shards does not import `pyspark.ml` (about
half a second of CPU per rank, for nothing it uses).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional


@dataclass(frozen=True)
class PreparedData:
    """Where the training (and validation) rows are, and what their columns hold."""

    train_path: str
    val_path: Optional[str]
    filesystem: Any
    columns: Dict[str, Any]
    train_rows: int
    val_rows: int
