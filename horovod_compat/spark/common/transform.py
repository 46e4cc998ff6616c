"""`transform` of the Spark estimators' models (`TorchModel`, `KerasModel`, ...): predictions in
Arrow batches.

An iterator Arrow UDF (pyspark >= 4.1; a pandas UDF before) over the feature columns (vectors
turned into arrays, which Arrow carries) returns a struct of predictions; the other columns never
leave the JVM. The model travels as bytes made once on the driver and is loaded once per Python
worker (`load_once`: Spark reuses its Python workers from task to task, so a job of many
partitions pays it once per worker, not once per task); each Arrow batch of rows is one call of the
framework's predict function. A prediction with one value per row becomes a double column (a long
column for an integer label); any other becomes a `DenseVector` column, as in Horovod.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa

_INTEGRAL = ("int8", "int16", "int32", "int64")

#: Predict: (model, {feature column: numpy array}) -> one 2-D float64 array (rows x values) per output
Predict = Callable[[Any, Dict[str, np.ndarray]], List[np.ndarray]]

#: The model this Python worker last loaded, by the SHA-256 of its bytes (one entry).
_loaded: Dict[str, Any] = {}


def load_once(model_bytes: bytes, deserialize: Callable[[bytes], Any]) -> Any:
    """``deserialize(model_bytes)``, at most once per Python worker in a row."""
    key = hashlib.sha256(model_bytes).hexdigest()
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = deserialize(model_bytes)
    return _loaded[key]


def from_pandas(frame: Any, feature_cols: List[str]) -> Dict[str, np.ndarray]:
    batch = {}
    for name in feature_cols:
        values = frame[name].to_numpy()
        batch[name] = np.stack(values) if values.dtype == object else values
    return batch


def output_kinds(sizes: List[int], output_cols: List[str], label_cols: List[str],
                 metadata: Dict[str, Any]) -> Tuple[List[str], Any]:
    """Each output column's kind ("long", "double" or "vector", from the output's width and its
    label column's type) and the Spark struct type of the predictions (fields o0, o1, ...)."""
    from pyspark.sql import types as T

    from .estimator import EstimatorError

    if len(sizes) != len(output_cols):
        raise EstimatorError(f"transform: the model returns {len(sizes)} output(s) for "
                             f"{len(output_cols)} output column(s) {output_cols}.")
    kinds = []
    for i, size in enumerate(sizes):
        label = metadata.get(label_cols[i]) if i < len(label_cols) else None
        if size == 1 and (label is None or label.kind == "scalar"):
            kinds.append("long" if label is not None and label.dtype in _INTEGRAL else "double")
        else:
            kinds.append("vector")
    struct = T.StructType([
        T.StructField(f"o{i}", T.LongType() if kind == "long" else
                      T.DoubleType() if kind == "double" else T.ArrayType(T.DoubleType()))
        for i, kind in enumerate(kinds)])
    return kinds, struct


def arrow_predictions(outputs: List[np.ndarray], kinds: List[str]) -> Any:
    """The outputs as one Arrow struct array (fields o0, o1, ...)."""
    fields = []
    for kind, values in zip(kinds, outputs):
        if kind == "vector":
            rows, width = values.shape
            offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
            fields.append(pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1))))
        elif kind == "long":
            fields.append(pa.array(np.rint(values[:, 0]).astype(np.int64)))
        else:
            fields.append(pa.array(values[:, 0]))
    return pa.StructArray.from_arrays(fields, names=[f"o{i}" for i in range(len(fields))])


def predict_dataframe(params: Any, df: Any, model: Any, predict: Predict,
                      load: Callable[[], Any]) -> Any:
    """`df` with the output columns of `params` (the estimator's model: its feature, label and
    output columns and metadata): ``predict(load(), batch)`` per Arrow batch on the Spark workers.
    `model` is the driver's copy, run on one row here for the outputs' widths."""
    from pyspark.ml.functions import array_to_vector, vector_to_array
    from pyspark.sql import functions as F

    from .estimator import EstimatorError

    feature_cols = list(params.getFeatureColumns() or [])
    label_cols = list(params.getLabelColumns() or [])
    output_cols = list(params.getOutputCols() or [])
    metadata: Dict[str, Any] = params._get_metadata() or {}
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
    # What each output looks like: from one row, on the driver.
    sample = df.select(*[c.alias(n) for c, n in zip(inputs, feature_cols)]).limit(1).toPandas()
    sizes = [1] * len(output_cols)
    if len(sample):
        sizes = [o.shape[1] for o in predict(model, from_pandas(sample, feature_cols))]
    kinds, struct = output_kinds(sizes, output_cols, label_cols, metadata)

    def outputs_of(model: Any, batch: Dict[str, np.ndarray]) -> List[np.ndarray]:
        if len(batch[feature_cols[0]]):
            return predict(model, batch)
        return [np.zeros((0, s)) for s in sizes]

    if hasattr(F, "arrow_udf"):  # pyspark >= 4.1: Arrow arrays in and out, no pandas
        from distributor.shards import column_to_numpy

        def predict_arrow(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
            loaded = load()
            for columns in batches:
                columns = columns if isinstance(columns, tuple) else (columns,)
                batch = {n: column_to_numpy(c) for n, c in zip(feature_cols, columns)}
                yield arrow_predictions(outputs_of(loaded, batch), kinds)

        predictions = F.arrow_udf(predict_arrow, struct)(*inputs)
    else:
        def predict_pandas(batches: Iterator[Tuple[pd.Series, ...]]) -> Iterator[pd.DataFrame]:
            loaded = load()
            for columns in batches:
                columns = columns if isinstance(columns, tuple) else (columns,)
                frame = pd.DataFrame(dict(zip(feature_cols, columns)))
                outputs = outputs_of(loaded, from_pandas(frame, feature_cols))
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
