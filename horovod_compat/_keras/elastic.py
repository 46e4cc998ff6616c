"""Horovod's elastic Keras callbacks (shared by ``horovod.tensorflow.keras.elastic`` and
``horovod.keras.elastic``): commit the state every N batches and at each epoch's end, and keep
``state.batch`` / ``state.epoch`` current so a reset resumes where training was."""
from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["CommitStateCallbackImpl", "UpdateBatchStateCallbackImpl",
           "UpdateEpochStateCallbackImpl"]


class CommitStateCallbackImpl:
    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if int(batches_per_commit) < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = int(batches_per_commit)
        self.batches_remaining = self.batches_per_commit

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        # every rank starts counting afresh after a reset, so their commits line up
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.commit()

    def commit(self) -> None:
        self.state.commit()


class UpdateBatchStateCallbackImpl:
    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: Optional[int] = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        params = getattr(self, "params", None)
        if params and params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params.get("steps")
            # the first epoch after a reset has fewer batches left (what progress bars show)
            params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallbackImpl:
    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        # Keras counts epochs from 0 on every fit(); the state counts across resets
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        # +1: a reset after state.batch went back to 0 must not repeat this epoch
        self.state.epoch = self.initial_epoch + epoch + 1
