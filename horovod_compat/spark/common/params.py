"""``horovod.spark.common.params``: the estimators' and models' pyspark.ml Params.

Each parameter gets Horovod's getter and setter (`batch_size` -> `getBatchSize`/`setBatchSize`)
and a default; `__init__(**kwargs)` of the classes using them sets the ones given and rejects an
unknown name with the closest known one.
"""
from __future__ import annotations

import difflib
from typing import Any, Dict, Tuple

from pyspark.ml.param.shared import Param, Params

#: Horovod's spelling of a few accessor names that do not follow the capitalised snake case.
_ACCESSOR_NAMES = {"output_cols": "OutputCols"}


def _accessor(name: str) -> str:
    return _ACCESSOR_NAMES.get(name) or "".join(part.capitalize() for part in name.strip("_").split("_"))


def declare(cls: type, params: Dict[str, Tuple[Any, str]]) -> type:
    """Give `cls` a Param, a default, a getter and a setter for each `name: (default, doc)`."""
    defaults = dict(getattr(cls, "_param_defaults", {}))
    for name, (default, doc) in params.items():
        setattr(cls, name, Param(Params._dummy(), name, doc))
        defaults[name] = default
        suffix = _accessor(name)

        def getter(self: Any, _name: str = name) -> Any:
            return self.getOrDefault(getattr(self, _name))

        def setter(self: Any, value: Any, _name: str = name) -> Any:
            return self._set(**{_name: value})

        getter.__name__, setter.__name__ = f"get{suffix}", f"set{suffix}"
        getter.__doc__ = setter.__doc__ = doc
        if not hasattr(cls, getter.__name__):
            setattr(cls, getter.__name__, getter)
        if not hasattr(cls, setter.__name__):
            setattr(cls, setter.__name__, setter)
    cls._param_defaults = defaults
    return cls


class DeclaredParams(Params):
    """Params set from keyword arguments, with the declared defaults."""

    _param_defaults: Dict[str, Any] = {}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**self._param_defaults)
        self.setParams(**kwargs)

    def setParams(self, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in self._param_defaults]
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, list(self._param_defaults), n=1)
                hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise TypeError(
                f"{type(self).__name__} got unknown parameter(s) {', '.join(hints)}; its parameters "
                f"are {sorted(k for k in self._param_defaults if not k.startswith('_'))}."
            )
        return self._set(**kwargs)


class EstimatorParams(DeclaredParams):
    """The parameters every Horovod Spark estimator has."""


declare(EstimatorParams, {
    "num_proc": (None, "number of training processes (default: the backend's)"),
    "backend": (None, "backend that runs the training processes (default: SparkBackend)"),
    "store": (None, "Store for the intermediate data and the runs"),
    "model": (None, "model to train"),
    "optimizer": (None, "optimizer"),
    "loss": (None, "loss function, or one per label column"),
    "loss_weights": (None, "weight of each label column's loss"),
    "metrics": (None, "metric functions metric(output, label) recorded in the history"),
    "sample_weight_col": (None, "column with the weight of each row"),
    "gradient_compression": (None, "gradient compression (horovod.torch.Compression.fp16/none)"),
    "compress_sparse_cols": (False, "accepted for compatibility; vectors are always dense"),
    "feature_cols": (None, "feature columns, one per model input"),
    "continuous_cols": (None, "accepted for compatibility"),
    "categorical_cols": (None, "accepted for compatibility"),
    "label_cols": (None, "label columns, one per model output"),
    "validation": (None, "fraction of rows for validation, or a column name (1/True: validation row)"),
    "callbacks": ([], "callbacks"),
    "batch_size": (32, "rows per training batch and rank"),
    "val_batch_size": (None, "rows per validation batch (default: batch_size)"),
    "epochs": (1, "number of epochs"),
    "train_steps_per_epoch": (None, "training steps per epoch (default: the whole shard)"),
    "validation_steps_per_epoch": (None, "validation steps per epoch (default: the whole shard)"),
    "transformation_fn": (None, "function applied to each batch as a pandas DataFrame"),
    "train_reader_num_workers": (None, "accepted for compatibility (Petastorm's)"),
    "val_reader_num_workers": (None, "accepted for compatibility (Petastorm's)"),
    "reader_pool_type": (None, "accepted for compatibility (Petastorm's)"),
    "shuffle_buffer_size": (None, "rows per shuffle window (default: 4 row groups)"),
    "shuffle": (True, "shuffle the training rows every epoch"),
    "partitions_per_process": (10, "Parquet files written per training process"),
    "run_id": (None, "run name in the Store; a run with a checkpoint resumes from it"),
    "verbose": (1, "0: quiet; 1: a line per epoch"),
    "use_gpu": (True, "train on GPUs when the ranks have them"),
    "mp_start_method": (None, "accepted for compatibility"),
    "random_seed": (None, "seed of the validation split and the shuffles"),
    "label_shapes": (None, "shapes the label columns are reshaped to"),
    "inmemory_cache_all": (False, "accepted for compatibility"),
})


class ModelParams(DeclaredParams):
    """The parameters of a trained model (a Spark Transformer)."""

    def setOutputCols(self, value: Any) -> Any:
        return self._set(output_cols=value)

    def getOutputCols(self) -> Any:
        return self.getOrDefault(self.output_cols)


declare(ModelParams, {
    "history": (None, "metrics of every epoch"),
    "model": (None, "trained model"),
    "feature_columns": (None, "feature columns"),
    "label_columns": (None, "label columns"),
    "output_cols": (None, "prediction columns (default: <label>__output)"),
    "run_id": (None, "run that trained the model"),
    "_metadata": (None, "the training columns' layout"),
})
