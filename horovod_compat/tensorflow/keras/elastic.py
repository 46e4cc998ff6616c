"""``horovod.tensorflow.keras.elastic``: ``KerasState``, the elastic callbacks and ``run``."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from horovod_compat._keras import elastic as _impl
from horovod_compat.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401

keras = tf.keras

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]


class KerasState(TensorFlowKerasState):
    """A Keras ``model`` and its ``optimizer`` (default: ``model.optimizer``) plus keyword
    attributes (``batch=0, epoch=0``...), committed, restored and synced from rank 0."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


class CommitStateCallback(_impl.CommitStateCallbackImpl, keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__(state, batches_per_commit)


class UpdateBatchStateCallback(_impl.UpdateBatchStateCallbackImpl, keras.callbacks.Callback):
    """Keep ``state.batch`` at the current batch (0 again at each epoch's end)."""

    def __init__(self, state: Any) -> None:
        super().__init__(state)


class UpdateEpochStateCallback(_impl.UpdateEpochStateCallbackImpl, keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of epochs done, counted across resets."""

    def __init__(self, state: Any) -> None:
        super().__init__(state)
