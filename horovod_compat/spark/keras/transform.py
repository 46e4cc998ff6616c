"""`KerasModel.transform` (see `horovod_compat.spark.common.transform`): the model travels as
`.keras` bytes (never a pickled Keras object) and is loaded with the Keras the model was made with
(tf-keras when it is a tf-keras model); each Arrow batch is one `predict_on_batch`.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from ..common import transform


def _load(model_bytes: bytes, legacy: bool, custom_objects: Any) -> Any:
    from . import remote

    remote.use_flavor(legacy)
    return remote.model_from_bytes(remote.keras_module(legacy), model_bytes, custom_objects)


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
    from . import remote

    model = keras_model.getModel()
    legacy = remote.is_legacy_model(model)
    model_bytes = remote.model_to_bytes(model)
    custom = keras_model.getCustomObjects() or {}
    feature_cols = list(keras_model.getFeatureColumns() or [])
    return transform.predict_dataframe(
        keras_model, df, model,
        predict=lambda m, batch: _predict(m, batch, feature_cols),
        load=lambda: transform.load_once(model_bytes, lambda b: _load(b, legacy, custom)))
