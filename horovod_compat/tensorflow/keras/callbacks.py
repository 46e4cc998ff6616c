"""``horovod.tensorflow.keras.callbacks``: Horovod's Keras callbacks on ``tf.keras.callbacks``
(Keras 3, or tf-keras under ``TF_USE_LEGACY_KERAS=1``); behaviour in
``horovod_compat._keras.callbacks``."""
from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from horovod_compat._keras import callbacks as _impl
from horovod_compat.common.lifecycle import rank

keras = tf.keras

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]


class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallbackImpl,
                                       keras.callbacks.Callback):
    """Broadcast rank ``root_rank``'s model weights when training starts, and its model and
    optimizer variables after the first batch, so every worker starts from the same state (random
    initialization or a checkpoint loaded on one rank).  ``local_variables`` are left out."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__(root_rank, device, local_variables)


class MetricAverageCallback(_impl.MetricAverageCallbackImpl, keras.callbacks.Callback):
    """Average the epoch-end metrics over all ranks (in ``logs``, for the callbacks after it:
    put it before ``ReduceLROnPlateau``, ``TensorBoard``, checkpoints...)."""

    def __init__(self, device: str = "") -> None:
        super().__init__(device)


class LearningRateScheduleCallback(_impl.LearningRateScheduleCallbackImpl,
                                   keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until
    ``end_epoch`` (exclusive).  A constant ``multiplier`` m means ``m ** (epoch - start_epoch)``.
    ``staircase=True``: adjusted at each epoch's first batch; ``False``: at every batch with
    ``epoch + batch / steps_per_epoch`` (``steps_per_epoch`` found from ``fit``'s parameters)."""

    def __init__(self, initial_lr: float, multiplier: Any, start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None) -> None:
        super().__init__(initial_lr, multiplier, start_epoch, end_epoch, staircase,
                         momentum_correction, steps_per_epoch)


class LearningRateWarmupCallback(_impl.LearningRateWarmupCallbackImpl, keras.callbacks.Callback):
    """Gradual warmup (Goyal et al., 2017): ``initial_lr / size`` at the start to ``initial_lr``
    after ``warmup_epochs``, adjusted at every batch."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0) -> None:
        super().__init__(initial_lr, warmup_epochs, momentum_correction, steps_per_epoch, verbose)


_PLACEHOLDER = "hvd-best-model-checkpoint-unset"


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``ModelCheckpoint(save_best_only=True)`` that writes on rank 0 only.

    Horovod's signature has no ``filepath`` (its Spark estimator sets ``.filepath`` later); it is
    accepted here as a last keyword.  Keras 3 wants ``.keras``/``.h5`` (``.weights.h5`` with
    ``save_weights_only=True``)."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto", save_freq: Any = "epoch",
                 filepath: Any = None) -> None:
        placeholder = _PLACEHOLDER + (".weights.h5" if save_weights_only else ".keras")
        super().__init__(filepath=filepath if filepath is not None else placeholder,
                         monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def _save_model(self, epoch: int, batch: Any, logs: Any) -> None:
        if rank() != 0:
            return
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint: set `filepath` (a keyword argument, or the "
                             "attribute) before training")
        super()._save_model(epoch, batch, logs)
