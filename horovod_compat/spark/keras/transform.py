"""`KerasModel.transform`: predictions in Arrow batches, as `TorchModel.transform` does.

An iterator Arrow UDF (pyspark >= 4.1; a pandas UDF before) over the feature columns returns a
struct of predictions. The model travels as `.keras` bytes (never a pickled Keras object) and is
loaded once per Spark Python worker (by the bytes' SHA-256), with the Keras the model was made
with (tf-keras when it is a tf-keras model); each Arrow batch is one `predict_on_batch`. A
prediction with one value per row becomes a double column (a long column for an integer label);
any other a `DenseVector` column, as in Horovod.
"""
from __future__ import annotations

import hashlib
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa

from ..torch.transform import _arrow_predictions, _from_pandas, _output_kinds

#: The model this Python worker last loaded, by the SHA-256 of its bytes (one entry).
_loaded: Dict[str, Any] = {}


def _load(model_bytes: bytes, legacy: bool, custom_objects: Any) -> Any:
    from . import remote

    key = hashlib.sha256(model_bytes).hexdigest()
    if key not in _loaded:
        remote.use_flavor(legacy)
        _loaded.clear()
        _loaded[key] = remote.model_from_bytes(remote.keras_module(legacy), model_bytes, custom_objects)
    return _loaded[key]


def _predict(model: Any, batch: Dict[str, np.ndarray], feature_cols: List[str]) -> List[np.ndarray]:
    """The model's outputs, one 2-D float64 array (rows x values) per output."""
    from . import remote

    inputs, _ = remote.model_shapes(model)
    xs = []
    for i, name in enumerate(feature_cols):
        values = remote._reshaped(batch[name], inputs[i] if i < len(inputs) else None, True)
        xs.append(remote._cast(values, "float32"))
    outputs = model.predict_on_batch(xs[0] if len(xs) == 1 else xs)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    rows = len(batch[feature_cols[0]])
    return [np.asarray(o).reshape(rows, -1).astype(np.float64) for o in outputs]


def predict_dataframe(keras_model: Any, df: Any) -> Any:
    from pyspark.ml.functions import array_to_vector, vector_to_array
    from pyspark.sql import functions as F

    from ..common.estimator import EstimatorError
    from . import remote

    feature_cols = list(keras_model.getFeatureColumns() or [])
    label_cols = list(keras_model.getLabelColumns() or [])
    output_cols = list(keras_model.getOutputCols() or [])
    metadata: Dict[str, Any] = keras_model._get_metadata() or {}
    custom = keras_model.getCustomObjects() or {}
    fields = {f.name: f for f in df.schema.fields}
    missing = [c for c in feature_cols if c not in fields]
    if missing:
        raise EstimatorError(f"transform: the DataFrame has no feature column(s) {missing}; its "
                             f"columns are {sorted(fields)}.")
    clash = [c for c in output_cols if c in fields]
    if clash:
        raise EstimatorError(f"transform: output column(s) {clash} already exist in the DataFrame; "
                             "choose other names with setOutputCols([...]).")
    inputs = []
    for name in feature_cols:
        column = F.col(f"`{name}`")
        is_vector = type(fields[name].dataType).__name__ == "VectorUDT"
        inputs.append(vector_to_array(column, "float32") if is_vector else column)
    model = keras_model.getModel()
    legacy = remote.is_legacy_model(model)
    model_bytes = remote.model_to_bytes(model)
    # What each output looks like: from one row, on the driver.
    sample = df.select(*[c.alias(n) for c, n in zip(inputs, feature_cols)]).limit(1).toPandas()
    sizes = [1] * len(output_cols)
    if len(sample):
        sizes = [o.shape[1] for o in _predict(model, _from_pandas(sample, feature_cols), feature_cols)]
    kinds, struct = _output_kinds(sizes, output_cols, label_cols, metadata)

    def outputs_of(model: Any, batch: Dict[str, np.ndarray]) -> List[np.ndarray]:
        if len(batch[feature_cols[0]]):
            return _predict(model, batch, feature_cols)
        return [np.zeros((0, s)) for s in sizes]

    if hasattr(F, "arrow_udf"):  # pyspark >= 4.1: Arrow arrays in and out, no pandas
        from distributor.shards import column_to_numpy

        def predict_arrow(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
            loaded = _load(model_bytes, legacy, custom)
            for columns in batches:
                columns = columns if isinstance(columns, tuple) else (columns,)
                batch = {n: column_to_numpy(c) for n, c in zip(feature_cols, columns)}
                yield _arrow_predictions(outputs_of(loaded, batch), kinds)

        predictions = F.arrow_udf(predict_arrow, struct)(*inputs)
    else:
        def predict_pandas(batches: Iterator[Tuple[pd.Series, ...]]) -> Iterator[pd.DataFrame]:
            loaded = _load(model_bytes, legacy, custom)
            for columns in batches:
                columns = columns if isinstance(columns, tuple) else (columns,)
                frame = pd.DataFrame(dict(zip(feature_cols, columns)))
                outputs = outputs_of(loaded, _from_pandas(frame, feature_cols))
                yield pd.DataFrame({f"o{i}": list(v) if kind == "vector" else
                                    np.rint(v[:, 0]).astype(np.int64) if kind == "long" else v[:, 0]
                                    for i, (kind, v) in enumerate(zip(kinds, outputs))})

        predictions = F.pandas_udf(predict_pandas, struct)(*inputs)
    scratch = "__horovod_predictions"
    result = df.withColumn(scratch, predictions)
    for i, (name, kind) in enumerate(zip(output_cols, kinds)):
        value = F.col(scratch).getField(f"o{i}")
        result = result.withColumn(name, array_to_vector(value) if kind == "vector" else value)
    return result.drop(scratch)
