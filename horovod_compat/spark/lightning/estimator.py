"""``horovod.spark.lightning``: Horovod's Lightning estimator on Lightning 2.

`TorchEstimator(model=<LightningModule>, ...)` trains with the module's own `configure_optimizers`,
`training_step` and `validation_step` (each batch a dict of tensors by column) on `num_proc`
ranks with Lightning's DDP, passing `callbacks` (e.g. ModelCheckpoint, EarlyStopping),
`profiler`, `logger` and `trainer_args` to the Trainer. `fit` returns a `TorchModel` whose
`transform` predicts with the module's `forward`, as `horovod.spark.torch.TorchModel` does.
"""
from __future__ import annotations

import copy
from typing import Any

from ..common.estimator import EstimatorError, HorovodEstimator, as_list
from ..common.prepared import PreparedData
from ..common.params import declare
from ..torch.estimator import TorchModel as _TorchModel
from ..torch.remote import load_checkpoint
from . import remote


class TorchEstimator(HorovodEstimator):
    """Horovod's Spark estimator for a LightningModule."""

    def _check_model_params(self) -> None:
        model = self.getModel()
        if remote.lightning_package(model) is None:
            raise EstimatorError(
                f"horovod.spark.lightning.TorchEstimator trains a LightningModule (from "
                f"lightning.pytorch or pytorch_lightning), got {type(model).__name__}. Use "
                "horovod.spark.torch.TorchEstimator with optimizer= and loss= for a plain "
                "torch.nn.Module."
            )
        for name, hint in (("optimizer", "configure_optimizers"), ("loss", "training_step"),
                           ("loss_weights", "training_step")):
            if self.getOrDefault(name):
                raise EstimatorError(f"Parameter `{name}` cannot be given with a LightningModule; "
                                     f"implement LightningModule.{hint} instead.")
        module = self.getDataModule()
        if module is not None and not isinstance(module, type):
            raise EstimatorError(f"data_module must be a LightningDataModule class (each rank builds "
                                 f"its own), got an instance of {type(module).__name__}.")
        for hook in ("validation_epoch_end", "training_epoch_end", "test_epoch_end"):
            if hook in type(model).__dict__:
                raise EstimatorError(
                    f"{type(model).__name__}.{hook} is Lightning 1 API, which Lightning 2 removed. "
                    f"Move its code to on_{hook.replace('_epoch_end', '')}_epoch_end (collect the "
                    "step outputs in a list attribute yourself); see migration_guide/ in "
                    "horovod-compat."
                )

    def _fit_on_prepared_data(self, backend: Any, data: PreparedData, run_id: str) -> "TorchModel":
        seed = self.getRandomSeed()
        config = remote.LightningConfig(
            model=self.getModel(), feature_cols=as_list(self.getFeatureCols()),
            label_cols=as_list(self.getLabelCols()), sample_weight_col=self.getSampleWeightCol(),
            batch_size=self.getBatchSize(), val_batch_size=self.getValBatchSize() or self.getBatchSize(),
            epochs=self.getEpochs(), train_steps=self.getTrainStepsPerEpoch(),
            val_steps=self.getValidationStepsPerEpoch(),
            shuffle=bool(self.getShuffle()) and self.getShuffleBufferSize() != 0,
            seed=seed if seed is not None else 0, data=data, store=self.getStore(), run_id=run_id,
            callbacks=as_list(self.getCallbacks()), profiler=self.getProfiler(),
            logger=self.getLogger(), trainer_args=self.getTrainerArgs() or {},
            log_every_n_steps=self.getLogEveryNSteps(), checkpoint=self._read_checkpoint(run_id),
            data_module=self.getDataModule(),
            verbose=self.getVerbose(), use_gpu=bool(self.getUseGpu()),
        )
        results = backend.run(remote.train, args=(config,))
        state = load_checkpoint(results[0])
        model = copy.deepcopy(self.getModel())
        model.load_state_dict(state["model"])
        model.eval()
        return TorchModel(history=state["history"], model=model,
                          feature_columns=as_list(self.getFeatureCols()),
                          label_columns=as_list(self.getLabelCols()),
                          input_shapes=self.getInputShapes(), run_id=run_id,
                          _metadata=dict(data.columns))


declare(TorchEstimator, {
    "input_shapes": (None, "shape of each feature column's tensor for transform"),
    "loss_constructors": (None, "not used with a LightningModule"),
    "train_minibatch_fn": (None, "unused, as in Horovod: Lightning runs its own training step"),
    "num_gpus": (None, "accepted for compatibility (one device per rank)"),
    "logger": (None, "Lightning logger (default: none)"),
    "log_every_n_steps": (50, "Lightning's log_every_n_steps"),
    "data_module": (None, "LightningDataModule class each rank builds (with Horovod's keyword "
                          "arguments: train_dir, cur_shard, shard_count, ...) and fits on "
                          "(default: the rank's own Parquet shards)"),
    "loader_num_epochs": (None, "accepted for compatibility"),
    "terminate_on_nan": (False, "accepted for compatibility"),
    "profiler": (None, "Lightning profiler ('simple', 'advanced' or a Profiler)"),
    "trainer_args": (None, "more Trainer arguments, overriding the estimator's"),
    "debug_data_loader": (False, "accepted for compatibility"),
    "train_async_data_loader_queue_size": (None, "accepted for compatibility"),
    "val_async_data_loader_queue_size": (None, "accepted for compatibility"),
})


class TorchModel(_TorchModel):
    """A trained LightningModule as a Spark Transformer (predicts with its forward)."""
