"""``horovod.keras.elastic``: the same as ``horovod.tensorflow.keras.elastic`` (``tf.keras``)."""
from horovod_compat.tensorflow.keras.elastic import (
    CommitStateCallback, KerasState, UpdateBatchStateCallback, UpdateEpochStateCallback, run,
)

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
