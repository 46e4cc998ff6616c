"""`TorchModel.transform`: predictions in Arrow batches (`DataFrame.mapInPandas`).

An iterator Arrow UDF (pyspark >= 4.1; a pandas UDF before) over the feature columns (vectors
turned into arrays, which Arrow carries) returns a struct of predictions; the other columns never
leave the JVM. The model is pickled once on
the driver and unpickled once per Python worker (`_load`: Spark reuses its Python workers from
task to task, so a job of many partitions pays it once per worker, not once per task); each Arrow
batch of rows is one tensor per feature column and one forward pass (on one torch thread per task:
PySpark sets OMP_NUM_THREADS to spark.task.cpus in its Python workers). A prediction with one value per
row becomes a double column (a long column for an integer label); any other becomes a
`DenseVector` column, as in Horovod.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa

_INTEGRAL = ("int8", "int16", "int32", "int64")

#: The model this Python worker last unpickled, by the SHA-256 of its pickle (one entry).
_loaded: Dict[str, Any] = {}


def _load(model_bytes: bytes) -> Any:
    """The model pickled as `model_bytes`, unpickled at most once per Python worker in a row."""
    import hashlib

    key = hashlib.sha256(model_bytes).hexdigest()
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = cloudpickle.loads(model_bytes)
    return _loaded[key]


def _predict(model: Any, batch: Dict[str, np.ndarray], feature_cols: List[str], shapes: Any
             ) -> List[np.ndarray]:
    """The model's outputs, one 2-D float64 array (rows x values) per output, for a batch of
    numpy feature arrays."""
    import torch

    from .remote import to_tensors

    with torch.no_grad():
        outputs = model(*to_tensors(batch, feature_cols, shapes))
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    rows = len(batch[feature_cols[0]])
    return [o.detach().cpu().reshape(rows, -1).numpy().astype(np.float64) for o in outputs]


def _from_pandas(frame: Any, feature_cols: List[str]) -> Dict[str, np.ndarray]:
    batch = {}
    for name in feature_cols:
        values = frame[name].to_numpy()
        batch[name] = np.stack(values) if values.dtype == object else values
    return batch


def _output_kinds(sizes: List[int], output_cols: List[str], label_cols: List[str],
                  metadata: Dict[str, Any]) -> Tuple[List[str], Any]:
    """Each output column's kind ("long", "double" or "vector", from the output's width and its
    label column's type) and the Spark struct type of the predictions (fields o0, o1, ...)."""
    from pyspark.sql import types as T

    from ..common.estimator import EstimatorError

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


def _arrow_predictions(outputs: List[np.ndarray], kinds: List[str]) -> Any:
    """The outputs as one Arrow struct array (fields o0, o1, ...)."""
    import pyarrow as pa

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


def predict_dataframe(torch_model: Any, df: Any) -> Any:
    from pyspark.ml.functions import array_to_vector, vector_to_array
    from pyspark.sql import functions as F

    from ..common.estimator import EstimatorError

    feature_cols = list(torch_model.getFeatureColumns() or [])
    label_cols = list(torch_model.getLabelColumns() or [])
    output_cols = list(torch_model.getOutputCols() or [])
    shapes = torch_model.getInputShapes()
    metadata: Dict[str, Any] = torch_model._get_metadata() or {}
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
    model = torch_model.getModel()
    model.eval()
    model_bytes = cloudpickle.dumps(model)
    # What each output looks like: from one row, on the driver.
    sample = df.select(*[c.alias(n) for c, n in zip(inputs, feature_cols)]).limit(1).toPandas()
    sizes = [1] * len(output_cols)
    if len(sample):
        sizes = [o.shape[1] for o in _predict(model, _from_pandas(sample, feature_cols), feature_cols, shapes)]
    kinds, struct = _output_kinds(sizes, output_cols, label_cols, metadata)

    def outputs_of(model: Any, batch: Dict[str, np.ndarray]) -> List[np.ndarray]:
        if len(batch[feature_cols[0]]):
            return _predict(model, batch, feature_cols, shapes)
        return [np.zeros((0, s)) for s in sizes]

    if hasattr(F, "arrow_udf"):  # pyspark >= 4.1: Arrow arrays in and out, no pandas
        from distributor.shards import column_to_numpy

        def predict_arrow(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
            loaded = _load(model_bytes)
            for columns in batches:
                columns = columns if isinstance(columns, tuple) else (columns,)
                batch = {n: column_to_numpy(c) for n, c in zip(feature_cols, columns)}
                yield _arrow_predictions(outputs_of(loaded, batch), kinds)

        predictions = F.arrow_udf(predict_arrow, struct)(*inputs)
    else:
        def predict_pandas(batches: Iterator[Tuple[pd.Series, ...]]) -> Iterator[pd.DataFrame]:
            loaded = _load(model_bytes)
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
