"""``horovod.spark.common.estimator``: what every Horovod Spark estimator does around training.

`HorovodEstimator.fit(df)` checks the parameters and the columns, checks that the store can be
written, writes the rows to the store as Parquet (training and validation apart), and only then
hands the prepared data to the framework's `_fit_on_prepared_data`. `fit_on_parquet()` starts
from data already in the store. Every bad input is reported before a rank starts.
"""
from __future__ import annotations

import numbers
import uuid
from typing import Any, List, Optional

from distributor.extras import require

require("spark", "The Spark estimators (horovod.spark.torch, .keras, .lightning)")

from pyspark.ml import Estimator, Model  # noqa: E402

from .params import EstimatorParams, ModelParams
from .prepared import PreparedData
from .serialization import Persistable

#: Name of the column that says which rows are for validation, in the written Parquet data.
VALIDATION_FLAG = "__horovod_validation"


class EstimatorError(ValueError):
    """An estimator parameter or input that cannot be trained on; says what to change."""


def as_list(value: Any) -> List[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class HorovodEstimator(Estimator, EstimatorParams, Persistable):
    """Base of the estimators: data preparation, backend and store handling."""

    def __init__(self, **kwargs: Any) -> None:
        Estimator.__init__(self)
        EstimatorParams.__init__(self, **kwargs)

    # ---- framework hooks ---------------------------------------------------------------------
    def _check_model_params(self) -> None:
        """Framework checks of model/optimizer/loss, before any data is touched."""

    def _fit_on_prepared_data(self, backend: Any, data: PreparedData, run_id: str) -> Any:
        raise NotImplementedError()

    # ---- fit ---------------------------------------------------------------------------------
    def _fit(self, df: Any) -> Any:
        self._check_params()
        backend = self._get_or_create_backend()
        store = self._checked_store()
        data = self._prepare(store, df, backend.num_processes())
        return self._fit_on_prepared_data(backend, data, self._run_id())

    def fit_on_parquet(self, params: Optional[dict] = None, dataset_idx: Any = None) -> Any:
        """Train on Parquet data already in the store (its train/val data paths for `dataset_idx`)."""
        if params:
            return self.copy(params).fit_on_parquet(dataset_idx=dataset_idx)
        from distributor.shards import list_parquet_files, parquet_columns

        self._check_params()
        backend = self._get_or_create_backend()
        store = self._checked_store()
        fs = store.arrow_filesystem()
        train = store.get_localized_path(store.get_train_data_path(dataset_idx))
        val = store.get_localized_path(store.get_val_data_path(dataset_idx))
        try:
            columns = parquet_columns(train, self._columns(), fs)
        except (ValueError, FileNotFoundError) as exc:
            raise EstimatorError(f"fit_on_parquet: {exc} Write the data there first (e.g. with "
                                 "df.write.parquet(store.get_train_data_path())).") from None
        try:
            has_val = bool(list_parquet_files(val, fs))
        except FileNotFoundError:
            has_val = False
        data = self._counted(PreparedData(train, val if has_val else None, fs, columns, 0, 0),
                             backend.num_processes())
        return self._fit_on_prepared_data(backend, data, self._run_id())

    def _read_checkpoint(self, run_id: str) -> Optional[bytes]:
        store = self.getStore()
        path = store.get_checkpoint_file(run_id) if store.saving_runs() else None
        if not path or not store.exists(path):
            return None
        if self.getVerbose():
            print(f"Resuming training from last checkpoint: {path}", flush=True)
        return store.read(path)

    def _run_id(self) -> str:
        return self.getRunId() or f"pytorch_{uuid.uuid4().hex[:10]}"

    def _get_or_create_backend(self) -> Any:
        backend, num_proc = self.getBackend(), self.getNumProc()
        if backend is not None and num_proc is not None:
            raise EstimatorError("Give the estimator either backend= or num_proc=, not both "
                                 "(num_proc sets the backend's process count).")
        if backend is None:
            from .backend import SparkBackend

            backend = SparkBackend(num_proc=num_proc, verbose=self.getVerbose())
        return backend

    def _checked_store(self) -> Any:
        from .store import Store

        store = self.getStore()
        if store is None:
            raise EstimatorError("The estimator needs store=, e.g. Store.create('/tmp/horovod_work') "
                                 "(a directory every executor can reach).")
        if not isinstance(store, Store):
            raise EstimatorError(f"store must be a horovod.spark.common.store.Store, got "
                                 f"{type(store).__name__}; use Store.create(path).")
        store.check_writable()
        return store

    def _columns(self) -> List[str]:
        columns = as_list(self.getFeatureCols()) + as_list(self.getLabelCols())
        if self.getSampleWeightCol():
            columns.append(self.getSampleWeightCol())
        return list(dict.fromkeys(columns))

    def _check_params(self) -> None:
        if self.getModel() is None:
            raise EstimatorError("The estimator needs model=.")
        if not as_list(self.getFeatureCols()):
            raise EstimatorError("The estimator needs feature_cols=[...], the columns fed to the model.")
        if not as_list(self.getLabelCols()):
            raise EstimatorError("The estimator needs label_cols=[...], the columns the model predicts.")
        for name in ("batch_size", "epochs"):
            value = self.getOrDefault(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EstimatorError(f"{name} must be a positive int, got {value!r}.")
        for name in ("val_batch_size", "train_steps_per_epoch", "validation_steps_per_epoch"):
            value = self.getOrDefault(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise EstimatorError(f"{name} must be a positive int or None, got {value!r}.")
        validation = self.getValidation()
        if validation is not None and not isinstance(validation, str):
            if isinstance(validation, bool) or not isinstance(validation, numbers.Real) or \
                    not 0 <= validation < 1:
                raise EstimatorError(
                    f"validation must be a fraction in [0, 1) or a column name, got {validation!r}."
                )
        self._check_model_params()

    # ---- data --------------------------------------------------------------------------------
    def _prepare(self, store: Any, df: Any, num_proc: int) -> PreparedData:
        """Check the DataFrame's columns and write them to the store as Parquet."""
        from distributor.dataframe import inspect_columns, select_for_parquet, write_parquet
        from distributor.errors import LaunchValidationError
        from pyspark.sql import functions as F

        roles = {c: "feature column" for c in as_list(self.getFeatureCols())}
        roles.update({c: "label column" for c in as_list(self.getLabelCols())})
        weight = self.getSampleWeightCol()
        if weight:
            roles[weight] = "sample weight column"
        validation = self.getValidation()
        checked = self._columns()
        if isinstance(validation, str):
            roles[validation] = "validation column"
            checked = checked + [validation]
        try:
            columns, _ = inspect_columns(df, checked, roles)
        except LaunchValidationError as exc:
            raise EstimatorError(str(exc)) from None
        flag: Any = None
        if isinstance(validation, str):
            flag = F.col(f"`{validation}`").cast("boolean")
            columns.pop(validation, None)
        elif validation:
            seed = self.getRandomSeed()
            flag = F.rand(seed if seed is not None else 0) < float(validation)
        idx = uuid.uuid4().hex[:12]
        train_path = store.get_train_data_path(idx)
        val_path = store.get_val_data_path(idx)
        num_files = num_proc * max(1, int(self.getPartitionsPerProcess() or 1))
        if flag is None:
            write_parquet(select_for_parquet(df, columns), train_path, num_files, columns)
            val_local = None
        else:
            staging = f"{train_path}.staging"
            write_parquet(select_for_parquet(df, columns, [flag.alias(VALIDATION_FLAG)]), staging,
                          num_files, columns, partition_by=VALIDATION_FLAG)
            store.move(f"{staging}/{VALIDATION_FLAG}=false", train_path)
            has_val = store.exists(f"{staging}/{VALIDATION_FLAG}=true")
            if has_val:
                store.move(f"{staging}/{VALIDATION_FLAG}=true", val_path)
            store.delete(staging)
            val_local = store.get_localized_path(val_path) if has_val else None
            if not has_val:
                raise EstimatorError(
                    f"validation={validation!r} selected no row for validation. Use a larger "
                    "fraction, mark some rows in the validation column, or validation=None."
                )
        prepared = PreparedData(store.get_localized_path(train_path), val_local,
                                store.arrow_filesystem(), columns, 0, 0)
        return self._counted(prepared, num_proc)

    @staticmethod
    def _counted(data: PreparedData, num_proc: int) -> PreparedData:
        """`data` with its row counts (from the Parquet footers); every rank needs rows."""
        from distributor.shards import list_parquet_files, row_groups

        def rows(path: Optional[str]) -> int:
            if path is None:
                return 0
            try:
                return sum(n for _, _, n in row_groups(list_parquet_files(path, data.filesystem),
                                                       data.filesystem))
            except FileNotFoundError:
                return 0

        train_rows, val_rows = rows(data.train_path), rows(data.val_path)
        for what, count in (("training", train_rows), ("validation", val_rows)):
            if (what == "training" or data.val_path) and count < num_proc:
                raise EstimatorError(
                    f"The {what} data has {count} row(s), fewer than the {num_proc} training "
                    "processes: every process needs at least one row. Use more data, a different "
                    "validation split, or fewer processes (num_proc)."
                )
        return PreparedData(data.train_path, data.val_path, data.filesystem, data.columns,
                            train_rows, val_rows)


class HorovodModel(Model, ModelParams, Persistable):
    """Base of the trained models (Spark Transformers)."""

    def __init__(self, **kwargs: Any) -> None:
        Model.__init__(self)
        ModelParams.__init__(self, **kwargs)
        if self.getOutputCols() is None and self.getLabelColumns():
            self.setOutputCols([f"{c}__output" for c in self.getLabelColumns()])

    def _get_metadata(self) -> Any:
        return self.getOrDefault(self._metadata)
