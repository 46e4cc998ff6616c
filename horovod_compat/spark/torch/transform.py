"""`TorchModel.transform` (see `horovod_compat.spark.common.transform`): the model is pickled once on
the driver; each Arrow batch of rows is one tensor per feature column and one forward pass (on one
torch thread per task: PySpark sets OMP_NUM_THREADS to spark.task.cpus in its Python workers).
"""
from __future__ import annotations

from typing import Any, Dict, List

import cloudpickle
import numpy as np

from ..common import transform


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


def predict_dataframe(torch_model: Any, df: Any) -> Any:
    model = torch_model.getModel()
    model.eval()
    model_bytes = cloudpickle.dumps(model)
    feature_cols = list(torch_model.getFeatureColumns() or [])
    shapes = torch_model.getInputShapes()
    return transform.predict_dataframe(
        torch_model, df, model,
        predict=lambda m, batch: _predict(m, batch, feature_cols, shapes),
        load=lambda: transform.load_once(model_bytes, cloudpickle.loads))
