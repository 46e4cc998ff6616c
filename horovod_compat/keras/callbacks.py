"""``horovod.keras.callbacks``: the same callbacks as ``horovod.tensorflow.keras.callbacks``
(both on ``tf.keras``: Keras 3, or tf-keras under ``TF_USE_LEGACY_KERAS=1``)."""
from horovod_compat.tensorflow.keras.callbacks import (
    BestModelCheckpoint, BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, MetricAverageCallback,
)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]
